// test/reference/classifier_ref.cpp: the CPU reference of llmc/kernels/classifier.h (declared in test/reference/kernels_ref.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test/reference/kernels_ref.h"

namespace llmc {

// CPU reference: FP64 log-sum-exp; same ignore / out-of-range conventions as the kernel.
void fused_classifier_cpu(float* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                          bool write_dlogits) {
  for (int n = 0; n < N; n++) {
    float* x = logits + static_cast<size_t>(n) * Vp;
    const int target = targets[n];
    if (target < 0) {
      losses[n] = 0.0f;
      if (write_dlogits)
        for (int c = 0; c < Vp; c++) x[c] = 0.0f;
      continue;
    }
    double max = -INFINITY;
    for (int c = 0; c < V; c++) max = std::fmax(max, static_cast<double>(x[c]));
    double sum = 0.0;
    for (int c = 0; c < V; c++) sum += std::exp(x[c] - max);
    const double lse = max + std::log(sum);
    losses[n] = static_cast<float>(target < V ? lse - x[target] : NAN);
    if (!write_dlogits) continue;
    for (int c = 0; c < Vp; c++) {
      const double prob = c < V ? std::exp(x[c] - max) / sum : 0.0;
      x[c] = static_cast<float>(dloss * (prob - (c == target ? 1.0 : 0.0)));
    }
  }
}

}  // namespace llmc
