// llmc/kernels/classifier.cu: fused softmax + cross-entropy + dlogits over the (padded) vocabulary, one block per row; the
// probabilities are never written to memory. Two kernels (the row staged in shared memory for vocabularies up to
// 57,344 columns: one read and one write of the logits; a two-pass online-softmax kernel above that) and the CPU
// reference; the mean loss of a micro-batch accumulated on the device (accumulate_mean_loss).
#include <cfloat>
#include <cmath>
#include <vector>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/classifier.h"

namespace llmc {

constexpr int kClassifierThreads = 1024;
constexpr float kLog2e = 1.4426950408889634f;

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

// exp2 on the special-function unit (relative error ~2^-22, flushes subnormal results to 0: they are below any
// bf16 probability that matters and below the FP32 sum's resolution).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The shared-memory variant, for rows of up to kClassifierSmemMaxVp columns: the block copies its row into shared
// memory while taking the max (one read of the logits), sums exp(logit - max) from shared memory, then writes the
// dlogits (one write). 512 threads and ~100 KB of shared memory per block for GPT-2's 50,304 columns, so two blocks
// share an SM and one block's loads overlap the other's arithmetic. Same loss and dlogits formulas and conventions
// as the two-pass kernel; the sums are folded in a fixed order (deterministic).
constexpr int kClassifierSmemThreads = 512;
constexpr int kClassifierSmemMaxVp = 56 * 1024;  // 112 KB of bf16: two blocks per SM on Hopper (228 KB)

__device__ inline float block_fold(float v, float* warp_partials, bool is_max) {
  constexpr int kNumWarps = kClassifierSmemThreads / kWarpSize;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  __syncthreads();  // the previous fold's readers are done with warp_partials
  if (lane == 0) warp_partials[warp] = v;
  __syncthreads();
  float total = warp_partials[0];  // every thread folds the warps in the same order: identical bits everywhere
#pragma unroll
  for (int w = 1; w < kNumWarps; w++) total = is_max ? fmaxf(total, warp_partials[w]) : total + warp_partials[w];
  return total;
}

__global__ void __launch_bounds__(kClassifierSmemThreads, 2)
    fused_classifier_smem_kernel(bf16* logits, float* losses, const int* targets, int V, int Vp, float dloss,
                                 bool write_dlogits) {
  extern __shared__ x128 row_chunks[];  // (Vp / 8,) this row's logits
  __shared__ float warp_partials[kWarpSize];
  const int row = blockIdx.x;
  bf16* x = logits + static_cast<size_t>(row) * Vp;
  const int target = targets[row];
  const int num_chunks = Vp / 8;
  if (target < 0) {
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (write_dlogits)
      for (int i = threadIdx.x; i < num_chunks; i += blockDim.x) store128(x + i * 8, x128::filled(0.0f));
    return;
  }
  float thread_max = -FLT_MAX;
  for (int i = threadIdx.x; i < num_chunks; i += blockDim.x) {
    const x128 p = load128cs(x + i * 8);
    row_chunks[i] = p;
    const int valid = min(8, V - i * 8);  // columns >= V are padding, never read into the statistics
#pragma unroll
    for (int k = 0; k < 8; k++)
      if (k < valid) thread_max = fmaxf(thread_max, __bfloat162float(p[k]));
  }
  const float max = block_fold(thread_max, warp_partials, true);  // its barriers also publish row_chunks
  const float max_log2 = max * kLog2e;
  float thread_sum = 0.0f;
  for (int i = threadIdx.x; i < num_chunks; i += blockDim.x) {
    const x128 p = row_chunks[i];
    const int valid = min(8, V - i * 8);
#pragma unroll
    for (int k = 0; k < 8; k++)
      if (k < valid) thread_sum += fast_exp2(fmaf(__bfloat162float(p[k]), kLog2e, -max_log2));
  }
  const float sum = block_fold(thread_sum, warp_partials, false);
  const float target_logit = target < V ? __bfloat162float(reinterpret_cast<const bf16*>(row_chunks)[target]) : NAN;
  if (threadIdx.x == 0) losses[row] = max + logf(sum) - target_logit;
  if (!write_dlogits) return;

  const float scale = dloss / sum;  // dlogit = dloss * prob - dloss * onehot
  for (int i = threadIdx.x; i < num_chunks; i += blockDim.x) {
    const x128 p = row_chunks[i];
    x128 g;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const int col = i * 8 + k;
      const float scaled_prob = col < V ? fast_exp2(fmaf(__bfloat162float(p[k]), kLog2e, -max_log2)) * scale : 0.0f;
      g[k] = __float2bfloat16_rn(col == target ? scaled_prob - dloss : scaled_prob);
    }
    store128(x + i * 8, g);
  }
}

void fused_classifier(bf16* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                      bool write_dlogits, cudaStream_t stream) {
  require_multiple_of_8("fused_classifier", "Vp (padded vocabulary)", Vp);
  require_aligned16("fused_classifier", "logits", logits);
  if (V <= 0 || V > Vp) throw_error("fused_classifier: vocabulary V = %d must be in [1, Vp = %d]", V, Vp);
  if (N <= 0) return;
  if (Vp <= kClassifierSmemMaxVp) {
    const size_t smem = static_cast<size_t>(Vp) * sizeof(bf16);
    static size_t smem_opted_in = 0;  // per process: the attribute is set once for the largest row seen
    if (smem > smem_opted_in) {
      CUDA_CHECK(cudaFuncSetAttribute(fused_classifier_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
      smem_opted_in = smem;
    }
    fused_classifier_smem_kernel<<<N, kClassifierSmemThreads, smem, stream>>>(logits, losses, targets, V, Vp, dloss,
                                                                             write_dlogits);
  } else {  // large vocabularies (e.g. Llama 3's 128,256): two passes over the row
    fused_classifier_kernel<<<N, kClassifierThreads, 0, stream>>>(logits, losses, targets, V, Vp, dloss,
                                                                  write_dlogits);
  }
  CUDA_CHECK_LAUNCH();
}

// One block of kLossThreads: thread t sums rows t, t + kLossThreads, ... in FP64 (losses and a count of the rows
// kept), then a fixed-order tree over the threads; thread 0 adds weight * sum / count to total[0].
constexpr int kLossThreads = 1024;
__global__ void __launch_bounds__(kLossThreads)
    accumulate_mean_loss_kernel(double* total, const float* losses, const int* targets, int N, double weight) {
  __shared__ double sums[kLossThreads];
  __shared__ int counts[kLossThreads];
  double sum = 0.0;
  int count = 0;
  for (int i = threadIdx.x; i < N; i += kLossThreads) {
    if (targets[i] < 0) continue;
    sum += losses[i];
    count++;
  }
  sums[threadIdx.x] = sum;
  counts[threadIdx.x] = count;
  __syncthreads();
  for (int half = kLossThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      counts[threadIdx.x] += counts[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && counts[0] > 0) total[0] += weight * (sums[0] / counts[0]);
}

void accumulate_mean_loss(double* total, const float* losses, const int* targets, int N, double weight,
                          cudaStream_t stream) {
  if (N <= 0) return;
  accumulate_mean_loss_kernel<<<1, kLossThreads, 0, stream>>>(total, losses, targets, N, weight);
  CUDA_CHECK_LAUNCH();
}

double mean_loss_host(const float* losses, const int* targets, int N) {
  double sum = 0.0;
  int count = 0;
  for (int i = 0; i < N; i++) {
    if (targets[i] < 0) continue;
    sum += losses[i];
    count++;
  }
  return count > 0 ? sum / count : 0.0;
}

}  // namespace llmc
