// test/reference/swiglu_ref.cpp: the CPU reference of llmc/kernels/swiglu.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test/reference/kernels_ref.h"

namespace llmc {

// CPU references in FP64.
void swiglu_forward_cpu(float* out, const float* gate_up, int N, int F) {
  for (int n = 0; n < N; n++) {
    const float* row = gate_up + static_cast<size_t>(n) * 2 * F;
    for (int j = 0; j < F; j++) {
      const double g = row[j], sig = 1.0 / (1.0 + std::exp(-g));
      out[static_cast<size_t>(n) * F + j] = static_cast<float>(g * sig * row[F + j]);
    }
  }
}

void swiglu_backward_cpu(float* dgate_up, const float* dout, const float* gate_up, int N, int F) {
  for (int n = 0; n < N; n++) {
    const float* row = gate_up + static_cast<size_t>(n) * 2 * F;
    float* drow = dgate_up + static_cast<size_t>(n) * 2 * F;
    for (int j = 0; j < F; j++) {
      const double g = row[j], u = row[F + j], d = dout[static_cast<size_t>(n) * F + j];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      drow[j] = static_cast<float>(d * u * sig * (1.0 + g * (1.0 - sig)));
      drow[F + j] = static_cast<float>(d * g * sig);
    }
  }
}

}  // namespace llmc
