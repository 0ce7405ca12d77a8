// test/reference/reduce_ref.cpp: the CPU reference of llmc/kernels/reduce.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test/reference/kernels_ref.h"

namespace llmc {

void bias_backward_cpu(float* dbias, const float* dout, int N, int OC) {
  std::vector<double> sum(OC, 0.0);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < OC; c++) sum[c] += dout[static_cast<size_t>(n) * OC + c];
  for (int c = 0; c < OC; c++) dbias[c] += static_cast<float>(sum[c]);
}

double global_norm_cpu(const float* values, size_t n) {
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += static_cast<double>(values[i]) * values[i];
  return std::sqrt(sum);
}

void add_bias_cpu(float* x, const float* bias, int M, int N) {
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) x[static_cast<size_t>(m) * N + n] += bias[n];
}

}  // namespace llmc
