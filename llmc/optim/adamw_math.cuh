// llmc/optim/adamw_math.cuh: the AdamW arithmetic of one element, shared by the update kernel
// (llmc/optim/adamw_update.cu) and its CPU reference (test/reference/optim_ref.h), so that both round alike.
#pragma once

#include <cmath>

#include <cuda_runtime.h>

#include "llmc/core/common.h"
#include "llmc/core/float_rn.cuh"

namespace llmc {

// The per-step constants, bias corrections computed once on the host in FP64 (the CPU reference does the same).
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;  // 1 - beta1^t
  float bias_correction2;  // 1 - beta2^t
};

inline AdamWStep make_adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
  if (t < 1) throw_error("adamw_update: optimizer step t = %d must be >= 1 (t is 1-based)", t);
  return {lr,
          beta1,
          beta2,
          eps,
          weight_decay,
          static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t)),
          static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t))};
}

// One parameter: the documented update in FP32, in the same operation order on host and device (products and sums
// through llmc/core/float_rn.cuh, so the device rounds exactly like the host reference; division and sqrtf are IEEE
// round-to-nearest on both unless built with fast math).
__host__ __device__ inline void adamw_element(float& master, float& m, float& v, float grad, float grad_scale,
                                              const AdamWStep& s) {
  const float g = mul_rn(grad, grad_scale);
  m = add_rn(mul_rn(s.beta1, m), mul_rn(1.0f - s.beta1, g));
  v = add_rn(mul_rn(s.beta2, v), mul_rn(mul_rn(1.0f - s.beta2, g), g));
  const float m_hat = m / s.bias_correction1;
  const float v_hat = v / s.bias_correction2;
  const float update = add_rn(m_hat / add_rn(sqrtf(v_hat), s.eps), mul_rn(s.weight_decay, master));
  master = master - mul_rn(s.lr, update);
}

}  // namespace llmc
