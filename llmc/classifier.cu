// llmc/classifier: fused softmax + cross-entropy + dlogits over the (padded) vocabulary, one block per row; the
// probabilities are never written to memory. Kernel and CPU reference.
#include <cfloat>
#include <cmath>
#include <vector>

#include "llmc/cuda_utils.cuh"
#include "llmc/kernels.h"

namespace llmc {

constexpr int kClassifierThreads = 1024;

// Running softmax statistics of a set of logits: max and sum of exp(logit - max). Starts from -FLT_MAX (not -inf) so
// that merging two empty sets never computes exp(-inf - -inf).
struct SoftmaxStats {
  float max;
  float sum;
};

__device__ inline SoftmaxStats merge_stats(SoftmaxStats a, SoftmaxStats b) {
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// Block-wide merge: butterfly within each warp (every lane ends with the same bits, the merge being symmetric), then
// every thread merges the per-warp results in warp order. Every thread returns the same statistics.
__device__ inline SoftmaxStats block_merge_stats(SoftmaxStats s) {
  __shared__ SoftmaxStats warp_stats[kWarpSize];
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    SoftmaxStats other{__shfl_xor_sync(0xffffffffu, s.max, offset), __shfl_xor_sync(0xffffffffu, s.sum, offset)};
    s = merge_stats(s, other);
  }
  if (threadIdx.x % kWarpSize == 0) warp_stats[threadIdx.x / kWarpSize] = s;
  __syncthreads();
  SoftmaxStats total = warp_stats[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / kWarpSize); w++) total = merge_stats(total, warp_stats[w]);
  return total;
}

// One block per row n of logits (N, Vp):
//   pass 1: online max / sum of exp over columns [0, V) -> losses[n] = logsumexp - logits[n, target]
//   pass 2 (write_dlogits): logits[n, :] = dloss * (softmax - onehot(target)), 0 in columns [V, Vp)
// target < 0: ignored row (loss 0, dlogits 0). target >= V is a caller bug: the loss is NaN so that it shows.
__global__ void __launch_bounds__(kClassifierThreads)
    fused_classifier_kernel(bf16* logits, float* losses, const int* targets, int V, int Vp, float dloss,
                            bool write_dlogits) {
  const int row = blockIdx.x;
  bf16* x = logits + static_cast<size_t>(row) * Vp;
  const int target = targets[row];
  if (target < 0) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (write_dlogits)
      for (int c = threadIdx.x * 8; c < Vp; c += blockDim.x * 8) store128(x + c, x128::filled(0.0f));
    return;
  }
  // Read before the block merge's barrier, hence before any thread overwrites the row in pass 2.
  const float target_logit = target < V ? __bfloat162float(x[target]) : NAN;

  SoftmaxStats stats{-FLT_MAX, 0.0f};
  for (int c = threadIdx.x * 8; c < V; c += blockDim.x * 8) {
    const x128 p = load128(x + c);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      if (c + k >= V) break;
      const float v = __bfloat162float(p[k]);
      if (v > stats.max) {
        stats.sum = stats.sum * expf(stats.max - v) + 1.0f;
        stats.max = v;
      } else {
        stats.sum += expf(v - stats.max);
      }
    }
  }
  stats = block_merge_stats(stats);
  if (threadIdx.x == 0) losses[row] = stats.max + logf(stats.sum) - target_logit;
  if (!write_dlogits) return;

  const float inv_sum = 1.0f / stats.sum;
  for (int c = threadIdx.x * 8; c < Vp; c += blockDim.x * 8) {
    const x128 p = load128cs(x + c);
    x128 g;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const int col = c + k;
      const float prob = col < V ? expf(__bfloat162float(p[k]) - stats.max) * inv_sum : 0.0f;
      const float onehot = col == target ? 1.0f : 0.0f;
      g[k] = __float2bfloat16_rn(dloss * (prob - onehot));
    }
    store128(x + c, g);
  }
}

void fused_classifier(bf16* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                      bool write_dlogits, cudaStream_t stream) {
  require_multiple_of_8("fused_classifier", "Vp (padded vocabulary)", Vp);
  require_aligned16("fused_classifier", "logits", logits);
  if (V <= 0 || V > Vp) throw_error("fused_classifier: vocabulary V = %d must be in [1, Vp = %d]", V, Vp);
  if (N <= 0) return;
  fused_classifier_kernel<<<N, kClassifierThreads, 0, stream>>>(logits, losses, targets, V, Vp, dloss,
                                                                write_dlogits);
  CUDA_CHECK_LAUNCH();
}

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
