// test/reference/encoder_ref.cpp: the CPU reference of llmc/kernels/encoder.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test/reference/kernels_ref.h"

namespace llmc {

void encoder_forward_cpu(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const int n = b * T + t;
      const float* tok = wte + static_cast<size_t>(tokens[n]) * C;
      const float* pos = wpe ? wpe + static_cast<size_t>(t) * C : nullptr;
      for (int c = 0; c < C; c++) out[static_cast<size_t>(n) * C + c] = tok[c] + (pos ? pos[c] : 0.0f);
    }
}

// CPU reference, organised like the GPU (per token, rows in ascending position) but summing in FP64.
void encoder_backward_cpu(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C) {
  const int N = B * T;
  std::vector<int> order(N);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
  std::vector<double> acc(C);
  for (int i = 0; i < N;) {
    const int token = tokens[order[i]];
    std::fill(acc.begin(), acc.end(), 0.0);
    for (; i < N && tokens[order[i]] == token; i++)
      for (int c = 0; c < C; c++) acc[c] += dout[static_cast<size_t>(order[i]) * C + c];
    for (int c = 0; c < C; c++) dwte[static_cast<size_t>(token) * C + c] += static_cast<float>(acc[c]);
  }
  for (int t = 0; t < T && dwpe; t++)
    for (int c = 0; c < C; c++) {
      double sum = 0.0;
      for (int b = 0; b < B; b++) sum += dout[(static_cast<size_t>(b) * T + t) * C + c];
      dwpe[static_cast<size_t>(t) * C + c] += static_cast<float>(sum);
    }
}

}  // namespace llmc
