// test/reference/layernorm_ref.cpp: the CPU reference of llmc/kernels/layernorm.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "llmc/kernels/layernorm.h"
#include "test/reference/kernels_ref.h"

namespace llmc {

void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                           const float* bias, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<size_t>(n) * C;
    double sum = 0.0;
    for (int c = 0; c < C; c++) sum += x[c];
    const double m = sum / C;
    double sum_sq = 0.0;
    for (int c = 0; c < C; c++) sum_sq += (x[c] - m) * (x[c] - m);
    const double s = 1.0 / std::sqrt(sum_sq / C + kLayerNormEps);
    for (int c = 0; c < C; c++)
      out[static_cast<size_t>(n) * C + c] = static_cast<float>((x[c] - m) * s * weight[c] + bias[c]);
    if (mean) mean[n] = static_cast<float>(m);
    if (rstd) rstd[n] = static_cast<float>(s);
  }
}

void layernorm_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, const float* mean, const float* rstd, int N, int C) {
  std::vector<double> dweight_sum(C, 0.0), dbias_sum(C, 0.0);
  for (int n = 0; n < N; n++) {
    const float* d = dout + static_cast<size_t>(n) * C;
    const float* x = inp + static_cast<size_t>(n) * C;
    float* di = dinp + static_cast<size_t>(n) * C;
    const double m = mean[n], s = rstd[n];
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int c = 0; c < C; c++) {
      const double g = static_cast<double>(weight[c]) * d[c];
      sum_g += g;
      sum_g_xhat += g * (x[c] - m) * s;
    }
    const double mean_g = sum_g / C, mean_g_xhat = sum_g_xhat / C;
    for (int c = 0; c < C; c++) {
      const double g = static_cast<double>(weight[c]) * d[c];
      const double xhat = (x[c] - m) * s;
      di[c] += static_cast<float>((g - mean_g - xhat * mean_g_xhat) * s);
      dweight_sum[c] += d[c] * xhat;
      dbias_sum[c] += d[c];
    }
  }
  for (int c = 0; c < C; c++) {
    dweight[c] += static_cast<float>(dweight_sum[c]);
    dbias[c] += static_cast<float>(dbias_sum[c]);
  }
}

}  // namespace llmc
