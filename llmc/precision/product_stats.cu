// llmc/precision/product_stats.cu: the numerics of a quantised product against its reference (product_error_stats,
// llmc/precision/quantize.h): the same eight telemetry slots as a quantisation's statistics, so that
// finish_quant_stats turns them into an SNR. Two stages as the quantisers' statistics: a fixed grid of
// kQuantStatsBlocks x 256 threads strides over the elements in a fixed pattern, each block sums in a fixed order, and
// combine_quant_stats adds the blocks in a fixed order: the result does not depend on the GPU.
#include "llmc/core/common.h"
#include "llmc/core/cuda_utils.cuh"
#include "llmc/precision/quantize.h"

namespace llmc {

namespace {

constexpr int kThreads = 256;

__device__ inline float to_float(bf16 v) { return __bfloat162float(v); }
__device__ inline float to_float(float v) { return v; }

// Slots (quantize.h's QuantStatsSlot): the amax bits of ref, the bits of 1.0 (no scale), saturated 0, underflow
// (ref != 0 but got == 0), nonzero ref, sum ref^2, sum (got - ref)^2, clipped 0; the element count is the combine's.
template <class T>
__global__ void __launch_bounds__(kThreads) product_stats_kernel(double* partials, const T* got, const T* ref,
                                                                 size_t n) {
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  double sum_ref2 = 0.0, sum_err2 = 0.0;
  unsigned underflow = 0, nonzero = 0, amax = 0;
  for (size_t i = thread; i < n; i += stride) {
    const float r = to_float(ref[i]), g = to_float(got[i]);
    const double err = static_cast<double>(g) - static_cast<double>(r);
    sum_ref2 += static_cast<double>(r) * r;
    sum_err2 += err * err;
    nonzero += r != 0.0f;
    underflow += r != 0.0f && g == 0.0f;
    amax = max(amax, amax_bits(fabsf(r)));
  }
  const double s_ref2 = block_sum(sum_ref2);
  const double s_err2 = block_sum(sum_err2);
  const double s_under = block_sum(static_cast<double>(underflow));
  const double s_nonzero = block_sum(static_cast<double>(nonzero));
  __shared__ unsigned warp_amax[kThreads / kWarpSize];
  amax = warp_max_bits(amax);
  if (threadIdx.x % kWarpSize == 0) warp_amax[threadIdx.x / kWarpSize] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / kWarpSize; w++) amax = max(amax, warp_amax[w]);
    double* p = partials + static_cast<size_t>(blockIdx.x) * kQuantStatsSlots;
    for (int k = 0; k < kQuantStatsSlots; k++) p[k] = 0.0;
    p[kStatAmax] = amax;
    p[kStatScale] = __float_as_uint(1.0f);
    p[kStatUnderflow] = s_under;
    p[kStatNonzero] = s_nonzero;
    p[kStatSumX2] = s_ref2;
    p[kStatSumErr2] = s_err2;
  }
}

template <class T>
void product_stats(double* stats_out, const T* got, const T* ref, size_t n, cudaStream_t stream) {
  if (!stats_out || !got || !ref) throw_error("product_error_stats: a null pointer (stats_out, got or ref)");
  double* partials = nullptr;
  CUDA_CHECK(cudaMallocAsync(&partials, sizeof(double) * kQuantStatsBlocks * kQuantStatsSlots, stream));
  product_stats_kernel<T><<<kQuantStatsBlocks, kThreads, 0, stream>>>(partials, got, ref, n);
  CUDA_CHECK_LAUNCH();
  combine_quant_stats(stats_out, partials, static_cast<double>(n), stream);
  CUDA_CHECK(cudaFreeAsync(partials, stream));
}

}  // namespace

void product_error_stats(double* stats_out, const bf16* got, const bf16* ref, size_t n, cudaStream_t stream) {
  product_stats(stats_out, got, ref, n, stream);
}

void product_error_stats(double* stats_out, const float* got, const float* ref, size_t n, cudaStream_t stream) {
  product_stats(stats_out, got, ref, n, stream);
}

}  // namespace llmc
