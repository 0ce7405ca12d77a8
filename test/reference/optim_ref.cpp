// test/reference/optim_ref.cpp: the CPU reference of the AdamW update (test/reference/optim_ref.h).
#include "test/reference/optim_ref.h"

#include "llmc/core/dtypes.h"
#include "llmc/optim/adamw_math.cuh"

namespace llmc {

void adamw_update_cpu(float* master, float* params, const float* grads, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale) {
  const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, weight_decay, t);
  for (size_t i = 0; i < n; i++) {
    adamw_element(master[i], m[i], v[i], grads[i], grad_scale, step);
    params[i] = bf16_decode(bf16_encode(master[i]));
  }
}

}  // namespace llmc
