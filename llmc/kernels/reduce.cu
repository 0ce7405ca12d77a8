// llmc/kernels/reduce.cu: deterministic reductions (bias gradient, column partial sums, global gradient norm), the
// float <-> bf16 conversions and the bias add of GEMMs whose epilogue cannot add it; kernels and CPU references. No float atomics: every sum has a fixed shape and order.
#include <cmath>
#include <vector>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/reduce.h"

namespace llmc {

// ---------------------------------------------------------------------------------------------------------------
// Stage 2 of every column sum: out (C) += sum over k in 0 .. num_chunks-1 of partials (num_chunks, C)[k, c].
// Block (32 columns) x (32 lanes over chunks): lane y sums chunks y, y + 32, ... in order, then thread y == 0 adds
// the 32 lane sums in order. Columns are contiguous across threadIdx.x, so loads coalesce; the chunk loop is unrolled
// (one accumulator, the same order) so that several loads are in flight per lane. blockIdx.y picks one of up to
// kMaxColumnSums (out, partials) pairs, the partials of pair a at partials + a * num_chunks * C.
constexpr int kColumnTile = 32;
constexpr int kChunkLanes = 32;

struct ColumnSumOutputs {
  float* out[kMaxColumnSums];
};

__global__ void sum_column_partials_kernel(ColumnSumOutputs outs, const float* __restrict__ partials, int num_chunks,
                                           int C) {
  __shared__ float lane_sums[kChunkLanes][kColumnTile + 1];  // +1: no bank conflicts on the column read
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const float* p = partials + static_cast<size_t>(blockIdx.y) * num_chunks * C;
  float sum = 0.0f;
  if (c < C) {
#pragma unroll 8
    for (int k = threadIdx.y; k < num_chunks; k += kChunkLanes) sum += p[static_cast<size_t>(k) * C + c];
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int y = 0; y < kChunkLanes; y++) total += lane_sums[y][threadIdx.x];
    outs.out[blockIdx.y][c] += total;
  }
}

void sum_column_partials(float* const* outs, int num_outs, const float* partials, int num_chunks, int C,
                         cudaStream_t stream) {
  if (C <= 0 || num_outs <= 0) return;
  if (num_outs > kMaxColumnSums) throw_error("sum_column_partials: %d outputs, at most %d", num_outs, kMaxColumnSums);
  ColumnSumOutputs o{};
  for (int a = 0; a < num_outs; a++) o.out[a] = outs[a];
  const dim3 block(kColumnTile, kChunkLanes);
  const dim3 grid(static_cast<unsigned>(ceil_div(C, kColumnTile)), static_cast<unsigned>(num_outs));
  sum_column_partials_kernel<<<grid, block, 0, stream>>>(o, partials, num_chunks, C);
  CUDA_CHECK_LAUNCH();
}

void sum_column_partials(float* out, const float* partials, int num_chunks, int C, cudaStream_t stream) {
  sum_column_partials(&out, 1, partials, num_chunks, C, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// bias_backward stage 1: one thread per (row chunk, 8 columns) sums dout over the chunk's rows in row order.
// partials (num_chunks, OC), overwritten.
__global__ void bias_partials_kernel(float* partials, const bf16* dout, int N, int OC, int num_chunks) {
  const int OC8 = OC / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<size_t>(num_chunks) * OC8) return;
  const int chunk = static_cast<int>(idx / OC8);
  const int c = static_cast<int>(idx % OC8) * 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int row_end = min(N, (chunk + 1) * kRowsPerChunk);
#pragma unroll 4
  for (int row = chunk * kRowsPerChunk; row < row_end; row++) {
    const x128 d = load128(dout + static_cast<size_t>(row) * OC + c);
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] += __bfloat162float(d[k]);
  }
  float* out = partials + static_cast<size_t>(chunk) * OC + c;
  store128(out, f128{{acc[0], acc[1], acc[2], acc[3]}});
  store128(out + 4, f128{{acc[4], acc[5], acc[6], acc[7]}});
}

size_t bias_backward_scratch_floats(int N, int OC) {
  return static_cast<size_t>(num_row_chunks(N)) * static_cast<size_t>(OC);
}

void bias_backward(float* dbias, float* scratch, const bf16* dout, int N, int OC, cudaStream_t stream) {
  require_multiple_of_8("bias_backward", "OC", OC);
  require_aligned16("bias_backward", "dout", dout);
  require_aligned16("bias_backward", "scratch", scratch);
  if (N <= 0) return;
  column_partials(scratch, dout, N, OC, stream);
  sum_column_partials(dbias, scratch, num_row_chunks(N), OC, stream);
}

void column_partials(float* partials, const bf16* x, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const int num_chunks = num_row_chunks(N);
  const int block = 256;
  const size_t threads = static_cast<size_t>(num_chunks) * (C / 8);
  bias_partials_kernel<<<ceil_div(threads, block), block, 0, stream>>>(partials, x, N, C, num_chunks);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------------------
// Global norm. Each tensor gives kNormBlocks partial sums of squares (one per block of a fixed grid, each thread
// striding through the tensor in a fixed pattern), so the result never depends on the GPU model or on scheduling.
constexpr int kNormBlocks = 256;
constexpr int kNormThreads = 512;

int global_norm_partials_per_tensor() { return kNormBlocks; }

// partials (kNormBlocks) = per-block sums of values[i]^2. kVec4: values is 16-byte aligned, the first n/4*4 elements
// are read as float4 and the n % 4 tail element-wise by the first threads.
template <bool kVec4>
__global__ void __launch_bounds__(kNormThreads) global_norm_squared_kernel(float* partials, const float* values,
                                                                          size_t n) {
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  float sum = 0.0f;
  size_t scalar_begin = 0;
  if (kVec4) {
    const size_t n4 = n / 4;
    for (size_t i = thread; i < n4; i += stride) {
      const f128 v = load128cs(values + 4 * i);
      sum += v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
    }
    scalar_begin = 4 * n4;
  }
  for (size_t i = scalar_begin + thread; i < n; i += stride) sum += values[i] * values[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

void global_norm_squared(float* partials, const float* values, size_t n, cudaStream_t stream) {
  if (is_aligned(values, 16))
    global_norm_squared_kernel<true><<<kNormBlocks, kNormThreads, 0, stream>>>(partials, values, n);
  else
    global_norm_squared_kernel<false><<<kNormBlocks, kNormThreads, 0, stream>>>(partials, values, n);
  CUDA_CHECK_LAUNCH();
}

// out[0] = sqrt(sum of partials (count)), one block, FP64 accumulation in a fixed order.
constexpr int kNormFinishThreads = 1024;
__global__ void global_norm_finish_kernel(float* out, const float* partials, int count) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) out[0] = static_cast<float>(sqrt(sum));
}

void global_norm_finish(float* out, const float* partials, int count, cudaStream_t stream) {
  global_norm_finish_kernel<<<1, kNormFinishThreads, 0, stream>>>(out, partials, count);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------------------
// Conversions, one element per thread (round to nearest even for float -> bf16).
__global__ void convert_float_to_bf16_kernel(bf16* out, const float* in, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}
__global__ void convert_bf16_to_float_kernel(float* out, const bf16* in, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);
}

// x (M, N) += bias (N), 8 columns per thread; optional amax of the result (one atomic per warp).
__global__ void add_bias_kernel(bf16* x, float* amax, const bf16* bias, size_t rows, int N) {
  const int N8 = N / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned bits = 0;
  if (idx < rows * N8) {
    const int c = static_cast<int>(idx % N8) * 8;
    bf16* p = x + (idx / N8) * N + c;
    x128 v = load128(p);
    const x128 b = load128(bias + c);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      v[k] = __float2bfloat16_rn(__bfloat162float(v[k]) + __bfloat162float(b[k]));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(v[k]))));
    }
    store128(p, v);
  }
  if (amax != nullptr) {
    bits = warp_max_bits(bits);
    if (threadIdx.x % kWarpSize == 0) atomic_max_amax(amax, bits);
  }
}

void add_bias(bf16* x, const bf16* bias, int M, int N, cudaStream_t stream, float* amax) {
  require_multiple_of_8("add_bias", "N", N);
  require_aligned16("add_bias", "x", x);
  require_aligned16("add_bias", "bias", bias);
  if (M <= 0) return;
  const size_t threads = static_cast<size_t>(M) * (N / 8);
  add_bias_kernel<<<ceil_div(threads, 256), 256, 0, stream>>>(x, amax, bias, static_cast<size_t>(M), N);
  CUDA_CHECK_LAUNCH();
}

void convert_float_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  convert_float_to_bf16_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}
void convert_bf16_to_float(float* out, const bf16* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  convert_bf16_to_float_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
