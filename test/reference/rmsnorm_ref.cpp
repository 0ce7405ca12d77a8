// test/reference/rmsnorm_ref.cpp: the CPU reference of llmc/kernels/rmsnorm.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test/reference/kernels_ref.h"

namespace llmc {

// ---------------------------------------------------------------------------------------------------------------
// CPU references in FP64.
void rmsnorm_forward_cpu(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<size_t>(n) * C;
    double sum_sq = 0.0;
    for (int c = 0; c < C; c++) sum_sq += static_cast<double>(x[c]) * x[c];
    const double s = 1.0 / std::sqrt(sum_sq / C + static_cast<double>(eps));
    for (int c = 0; c < C; c++) out[static_cast<size_t>(n) * C + c] = static_cast<float>(x[c] * s * weight[c]);
    if (rstd) rstd[n] = static_cast<float>(s);
  }
}

void rmsnorm_backward_cpu(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                          const float* rstd, int N, int C) {
  std::vector<double> dweight_sum(C, 0.0);
  for (int n = 0; n < N; n++) {
    const float* d = dout + static_cast<size_t>(n) * C;
    const float* x = inp + static_cast<size_t>(n) * C;
    float* di = dinp + static_cast<size_t>(n) * C;
    const double s = rstd[n];
    double sum_g_xhat = 0.0;
    for (int c = 0; c < C; c++) sum_g_xhat += static_cast<double>(weight[c]) * d[c] * x[c] * s;
    const double mean_g_xhat = sum_g_xhat / C;
    for (int c = 0; c < C; c++) {
      const double g = static_cast<double>(weight[c]) * d[c];
      const double xhat = x[c] * s;
      di[c] += static_cast<float>((g - xhat * mean_g_xhat) * s);
      dweight_sum[c] += d[c] * xhat;
    }
  }
  for (int c = 0; c < C; c++) dweight[c] += static_cast<float>(dweight_sum[c]);
}

}  // namespace llmc
