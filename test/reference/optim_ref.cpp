// test/reference/optim_ref.cpp: the CPU reference of the AdamW update (test/reference/optim_ref.h).
#include "test/reference/optim_ref.h"

#include <cmath>
#include <cstdint>

#include "llmc/core/dtypes.h"
#include "llmc/optim/adamw_math.cuh"

namespace llmc {

namespace {

// The reference's own codecs of the moment codes (bf16 through llmc/core/dtypes, not the CUDA conversions).
float decode_code(float c) { return c; }
float decode_code(__nv_bfloat16 c) { return bf16_decode(static_cast<__nv_bfloat16_raw>(c).x); }
void encode_code(float x, float* c) { *c = x; }
void encode_code(float x, __nv_bfloat16* c) {
  __nv_bfloat16_raw raw;
  raw.x = bf16_encode(x);
  *c = raw;
}

}  // namespace

template <class Storage>
void adamw_update_cpu(float* master, float* params, const float* grads, typename Storage::Code* m,
                      typename Storage::Code* v, size_t n, float lr, float beta1, float beta2, float eps,
                      float weight_decay, int t, float grad_scale) {
  const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, weight_decay, t);
  if (!std::isfinite(grad_scale)) return;  // the skipped step
  for (size_t i = 0; i < n; i++) {
    float mi = decode_code(m[i]), vi = decode_code(v[i]);
    adamw_element(master[i], mi, vi, grads[i], grad_scale, step);
    encode_code(mi, &m[i]);
    encode_code(vi, &v[i]);
    params[i] = bf16_decode(bf16_encode(master[i]));
  }
}

template void adamw_update_cpu<Fp32Moments>(float*, float*, const float*, float*, float*, size_t, float, float,
                                            float, float, float, int, float);
template void adamw_update_cpu<Bf16Moments>(float*, float*, const float*, __nv_bfloat16*, __nv_bfloat16*, size_t,
                                            float, float, float, float, float, int, float);

void adamw_update_cpu(float* master, float* params, const float* grads, float* m, float* v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale) {
  adamw_update_cpu<Fp32Moments>(master, params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
}

}  // namespace llmc
