// test/reference/gelu_ref.cpp: the CPU reference of llmc/kernels/gelu.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test/reference/kernels_ref.h"

namespace llmc {

// CPU references in FP64.
void gelu_forward_cpu(float* out, const float* inp, size_t n) {
  const double scale = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < n; i++) {
    const double x = inp[i];
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(scale * (x + 0.044715 * x * x * x))));
  }
}

void gelu_backward_inplace_cpu(float* dinout, const float* inp, size_t n) {
  const double scale = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < n; i++) {
    const double x = inp[i];
    const double tanh_u = std::tanh(scale * (x + 0.044715 * x * x * x));
    const double grad =
        0.5 * (1.0 + tanh_u) + 0.5 * x * (1.0 - tanh_u * tanh_u) * scale * (1.0 + 3.0 * 0.044715 * x * x);
    dinout[i] = static_cast<float>(dinout[i] * grad);
  }
}

}  // namespace llmc
