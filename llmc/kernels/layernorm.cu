// llmc/kernels/layernorm.cu: LayerNorm forward (plain and fused with the residual add) and backward kernels, FP32
// statistics, eps 1e-5 (the CPU reference is test/reference/layernorm_ref.cpp). One warp per row; parameter gradients
// through deterministic per-chunk partials (for C <= 4096 the backward is one fused pass: dinp and the partials from a
// single read of dout, inp and dinp). The forward kernels optionally write the FP8 1x16 copy of the normalised input x
// (template kSave), the backward kernels read x through a loader (BF16 or that copy; llmc/kernels/fp8_groups.cuh):
// one copy of each algorithm, the BF16 instantiations are the kernels as they were.
#include <cmath>
#include <vector>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/fp8_groups.cuh"
#include "llmc/kernels/reduce.h"
#include "llmc/kernels/layernorm.h"
#include "llmc/kernels/mma_ptx.cuh"

namespace llmc {

constexpr int kRowsPerBlock = 8;  // warps per block in the row kernels (one warp per row)

// Normalises one row x (C) held in global memory into out (C) with one warp; returns mean and rstd (same in all
// lanes) and raises out_amax_bits to the bits of the largest |out| this lane wrote. Lane l handles the 8-channel chunks
// l, l + 32, ...; the row is read three times (L1/L2 hits after the first). kSave: the third pass also writes row `row`
// of the FP8 copy of x into save (N rows; C a multiple of 16, so both lanes of a group are in the loop together).
template <bool kSave>
__device__ inline void layernorm_row(bf16* out, float& mean, float& rstd, unsigned& out_amax_bits, const bf16* x,
                                     const bf16* weight, const bf16* bias, int C, int lane, const Fp8GroupsOut& save,
                                     int row, int N) {
  float sum = 0.0f;
  for (int c = lane * 8; c < C; c += kWarpSize * 8) {
    const x128 p = load128(x + c);
#pragma unroll
    for (int k = 0; k < 8; k++) sum += __bfloat162float(p[k]);
  }
  mean = warp_sum(sum) / C;
  float sum_sq = 0.0f;
  for (int c = lane * 8; c < C; c += kWarpSize * 8) {
    const x128 p = load128(x + c);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float d = __bfloat162float(p[k]) - mean;
      sum_sq += d * d;
    }
  }
  rstd = rsqrtf(warp_sum(sum_sq) / C + kLayerNormEps);
  for (int c = lane * 8; c < C; c += kWarpSize * 8) {
    const x128 p = load128cs(x + c);
    if constexpr (kSave) fp8_groups_store8(save, p, row, c, N, C);
    const x128 w = load128(weight + c);
    const x128 b = load128(bias + c);
    x128 y;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float xhat = (__bfloat162float(p[k]) - mean) * rstd;
      y[k] = __float2bfloat16_rn(xhat * __bfloat162float(w[k]) + __bfloat162float(b[k]));
      out_amax_bits = max(out_amax_bits, amax_bits(fabsf(__bfloat162float(y[k]))));
    }
    store128(out + c, y);
  }
}

// max |out| of the warp's row into *amax (one atomic per warp; amax may be null).
__device__ inline void report_row_amax(float* amax, unsigned bits, int lane) {
  if (amax == nullptr) return;
  bits = warp_max_bits(bits);
  if (lane == 0) atomic_max_amax(amax, bits);
}

// out (N, C) = LayerNorm(inp (N, C)); mean, rstd (N) (either may be null: not saved); amax: max |out| (or null);
// kSave: the FP8 copy of inp into save.
template <bool kSave>
__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, float* amax, const bf16* inp,
                                         const bf16* weight, const bf16* bias, int N, int C, const Fp8GroupsOut save) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  float m, s;
  unsigned bits = 0;
  layernorm_row<kSave>(out + static_cast<size_t>(row) * C, m, s, bits, inp + static_cast<size_t>(row) * C, weight,
                       bias, C, lane, save, row, N);
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
  report_row_amax(amax, bits, lane);
}

// residual (N, C) = bf16(inp1 + inp2); out = LayerNorm(residual). Each lane re-reads only what it wrote itself.
// kSave: the FP8 copy of residual into save.
template <bool kSave>
__global__ void fused_residual_layernorm_kernel(bf16* residual, bf16* out, float* mean, float* rstd, float* amax,
                                                const bf16* inp1, const bf16* inp2, const bf16* weight,
                                                const bf16* bias, int N, int C, const Fp8GroupsOut save) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const size_t offset = static_cast<size_t>(row) * C;
  for (int c = lane * 8; c < C; c += kWarpSize * 8) {
    const x128 a = load128cs(inp1 + offset + c);
    const x128 b = load128cs(inp2 + offset + c);
    x128 r;
#pragma unroll
    for (int k = 0; k < 8; k++) r[k] = __float2bfloat16_rn(__bfloat162float(a[k]) + __bfloat162float(b[k]));
    store128(residual + offset + c, r);
  }
  float m, s;
  unsigned bits = 0;
  layernorm_row<kSave>(out + offset, m, s, bits, residual + offset, weight, bias, C, lane, save, row, N);
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
  report_row_amax(amax, bits, lane);
}

static void check_layernorm_args(const char* kernel, const void* out, const void* inp, const void* weight,
                                 const void* bias, int C) {
  require_multiple_of_8(kernel, "C", C);
  require_aligned16(kernel, "out", out);
  require_aligned16(kernel, "inp", inp);
  require_aligned16(kernel, "weight", weight);
  require_aligned16(kernel, "bias", bias);
}

// The FP8 copy a forward writes of its input (`name`): C a multiple of 16 and the copy's pointers, when one is wanted.
static void check_layernorm_save(const char* kernel, const char* name, const Fp8GroupsOut& save, int C) {
  if (save.wanted()) require_fp8_groups(kernel, name, save.codes, save.scale_inv, C);
}

// The same for C <= 256 * kChunks: the lane's kChunks 8-channel chunks of the row stay in registers, so the row is
// read from memory once (layernorm_row reads it three times, from L1/L2 after the first, which held the kernel to
// ~1.9 TB/s). Same chunk order and sums as layernorm_row: bit-identical outputs. kSave: the FP8 copy of inp into save.
template <int kChunks, bool kSave>
__global__ void layernorm_forward_row_in_registers_kernel(bf16* out, float* mean, float* rstd, float* amax,
                                                          const bf16* inp, const bf16* weight, const bf16* bias,
                                                          int N, int C, const Fp8GroupsOut save) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const bf16* x = inp + static_cast<size_t>(row) * C;
  auto valid = [&](int j) { return lane * 8 + j * kWarpSize * 8 < C; };
  x128 p[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; j++)
    if (valid(j)) p[j] = load128cs(x + lane * 8 + j * kWarpSize * 8);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; j++)
    if (valid(j))
#pragma unroll
      for (int k = 0; k < 8; k++) sum += __bfloat162float(p[j][k]);
  const float m = warp_sum(sum) / C;
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; j++)
    if (valid(j))
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float d = __bfloat162float(p[j][k]) - m;
        sum_sq += d * d;
      }
  const float s = rsqrtf(warp_sum(sum_sq) / C + kLayerNormEps);
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < kChunks; j++) {
    if (!valid(j)) continue;
    const int c = lane * 8 + j * kWarpSize * 8;
    if constexpr (kSave) fp8_groups_store8(save, p[j], row, c, N, C);
    const x128 w = load128(weight + c);
    const x128 b = load128(bias + c);
    x128 y;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float xhat = (__bfloat162float(p[j][k]) - m) * s;
      y[k] = __float2bfloat16_rn(xhat * __bfloat162float(w[k]) + __bfloat162float(b[k]));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(y[k]))));
    }
    store128(out + static_cast<size_t>(row) * C + c, y);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
  report_row_amax(amax, bits, lane);
}

// The forward kernel for C: the row in registers up to C = 1024 (GPT-2 124M / 350M: C = 768 / 1024, 3 / 4 chunks
// per lane), else layernorm_row's three reads.
template <bool kSave>
void launch_layernorm_forward(bf16* out, float* mean, float* rstd, float* out_amax, const bf16* inp,
                              const bf16* weight, const bf16* bias, int N, int C, const Fp8GroupsOut& save,
                              cudaStream_t stream) {
  const int grid = static_cast<int>(ceil_div(N, kRowsPerBlock));
  const int block = kRowsPerBlock * kWarpSize;
  auto launch = [&](auto kernel) {
    kernel<<<grid, block, 0, stream>>>(out, mean, rstd, out_amax, inp, weight, bias, N, C, save);
  };
  switch (static_cast<int>(ceil_div(static_cast<size_t>(C), kWarpSize * 8))) {
    case 1: launch(layernorm_forward_row_in_registers_kernel<1, kSave>); break;
    case 2: launch(layernorm_forward_row_in_registers_kernel<2, kSave>); break;
    case 3: launch(layernorm_forward_row_in_registers_kernel<3, kSave>); break;
    case 4: launch(layernorm_forward_row_in_registers_kernel<4, kSave>); break;
    default: launch(layernorm_forward_kernel<kSave>);
  }
  CUDA_CHECK_LAUNCH();
}

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                       int N, int C, cudaStream_t stream, float* out_amax, const Fp8GroupsOut& save_inp) {
  check_layernorm_args("layernorm_forward", out, inp, weight, bias, C);
  check_layernorm_save("layernorm_forward", "save_inp", save_inp, C);
  if (N <= 0) return;
  if (save_inp.wanted())
    launch_layernorm_forward<true>(out, mean, rstd, out_amax, inp, weight, bias, N, C, save_inp, stream);
  else
    launch_layernorm_forward<false>(out, mean, rstd, out_amax, inp, weight, bias, N, C, save_inp, stream);
}

void fused_residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* inp1,
                                      const bf16* inp2, const bf16* weight, const bf16* bias, int N, int C,
                                      cudaStream_t stream, float* out_amax, const Fp8GroupsOut& save_residual) {
  check_layernorm_args("fused_residual_layernorm_forward", out, inp1, weight, bias, C);
  require_aligned16("fused_residual_layernorm_forward", "inp2", inp2);
  require_aligned16("fused_residual_layernorm_forward", "residual", residual);
  check_layernorm_save("fused_residual_layernorm_forward", "save_residual", save_residual, C);
  if (N <= 0) return;
  const int grid = static_cast<int>(ceil_div(N, kRowsPerBlock));
  const int block = kRowsPerBlock * kWarpSize;
  if (save_residual.wanted())
    fused_residual_layernorm_kernel<true><<<grid, block, 0, stream>>>(residual, out, mean, rstd, out_amax, inp1, inp2,
                                                                      weight, bias, N, C, save_residual);
  else
    fused_residual_layernorm_kernel<false><<<grid, block, 0, stream>>>(residual, out, mean, rstd, out_amax, inp1,
                                                                       inp2, weight, bias, N, C, save_residual);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------------------
// Backward. With xhat = (x - mean) * rstd and g = weight * dout:
//   dinp = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat));  dweight = sum_rows dout * xhat;  dbias = sum_rows dout

// The kernels read x through a loader (Bf16Loader, Fp8GroupsLoader; llmc/kernels/fp8_groups.cuh), with the
// forward's mean and rstd either way.

// dinp (N, C) += the row gradient above. One warp per row; two passes over the row. inp: the loader of x (N, C).
template <class Loader>
__global__ void layernorm_backward_dinp_kernel(bf16* dinp, float* dinp_amax, const bf16* dout, const Loader inp,
                                               const bf16* weight, const float* mean, const float* rstd, int N,
                                               int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const size_t offset = static_cast<size_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int c = lane * 8; c < C; c += kWarpSize * 8) {
    const x128 d = load128(dout + offset + c);
    float x[8];
    inp.load8(x, offset + c, row, c);
    const x128 w = load128(weight + c);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float g = __bfloat162float(w[k]) * __bfloat162float(d[k]);
      sum_g += g;
      sum_g_xhat += g * (x[k] - m) * s;
    }
  }
  const float mean_g = warp_sum(sum_g) / C;
  const float mean_g_xhat = warp_sum(sum_g_xhat) / C;
  unsigned bits = 0;
  for (int c = lane * 8; c < C; c += kWarpSize * 8) {
    const x128 d = load128(dout + offset + c);  // plain loads: the param-partials kernel reads dout, inp next
    float x[8];
    inp.load8(x, offset + c, row, c);
    const x128 w = load128(weight + c);
    x128 di = load128(dinp + offset + c);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float g = __bfloat162float(w[k]) * __bfloat162float(d[k]);
      const float xhat = (x[k] - m) * s;
      di[k] = __float2bfloat16_rn(__bfloat162float(di[k]) + (g - mean_g - xhat * mean_g_xhat) * s);
      bits = max(bits, amax_bits(fabsf(__bfloat162float(di[k]))));
    }
    store128(dinp + offset + c, di);
  }
  report_row_amax(dinp_amax, bits, lane);
}

// Stage 1 of dweight / dbias: one thread per (row chunk, 8 channels) sums dout * xhat and dout over the chunk's rows
// in row order. dweight_partials, dbias_partials (num_row_chunks(N), C), overwritten. inp: the loader of x (N, C).
template <class Loader>
__global__ void layernorm_param_partials_kernel(float* dweight_partials, float* dbias_partials, const bf16* dout,
                                                const Loader inp, const float* mean, const float* rstd, int N, int C,
                                                int num_chunks) {
  const int C8 = C / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<size_t>(num_chunks) * C8) return;
  const int chunk = static_cast<int>(idx / C8);
  const int c = static_cast<int>(idx % C8) * 8;
  float dw[8] = {0, 0, 0, 0, 0, 0, 0, 0}, db[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int row_end = min(N, (chunk + 1) * kRowsPerChunk);
#pragma unroll 4
  for (int row = chunk * kRowsPerChunk; row < row_end; row++) {
    const x128 d = load128(dout + static_cast<size_t>(row) * C + c);
    float x[8];
    inp.load8(x, static_cast<size_t>(row) * C + c, row, c);
    const float m = mean[row], s = rstd[row];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float dk = __bfloat162float(d[k]);
      dw[k] += dk * ((x[k] - m) * s);
      db[k] += dk;
    }
  }
  const size_t out = static_cast<size_t>(chunk) * C + c;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    f128 pw, pb;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      pw[k] = dw[4 * half + k];
      pb[k] = db[4 * half + k];
    }
    store128(dweight_partials + out + 4 * half, pw);
    store128(dbias_partials + out + 4 * half, pb);
  }
}

// The fused backward for C <= kFusedMaxC: a block of ceil(C / 256) warps owns a chunk of kFusedRowsPerChunk rows;
// lane l of warp w owns channels 256w + 8l .. 256w + 8l + 7. Each thread streams its 16 bytes of dout and dinp and
// its 16-byte slot of x (the loader's stage8_async: the 8 bf16, or the 8 FP8 codes and their group's scale) of the
// chunk's rows through a ring of kStages rows in shared memory with cp.async (it reads back only what it copied
// itself, so the ring needs no barrier), which keeps up to kStages rows per block in flight. Per row, each warp
// sums g = weight * dout and g * xhat over its channels; the warps' sums meet in shared memory (one barrier per row,
// double-buffered by row parity) and every warp adds them in warp order, then writes its dinp channels. dout * xhat,
// dout and the dinp written accumulate in registers over the chunk's rows in row order: the parameter partials and
// the dinp column-sum partials, (ceil(N / 16), C) each. dout, inp and dinp are each read once.
constexpr int kFusedChannelsPerWarp = kWarpSize * 8;  // 256
constexpr int kFusedMaxWarps = 16;                     // blocks of at most 512 threads
constexpr int kFusedMaxC = kFusedMaxWarps * kFusedChannelsPerWarp;  // 4096
constexpr int kFusedRowsPerChunk = 16;
inline int num_fused_chunks(int N) { return static_cast<int>(ceil_div(static_cast<size_t>(N), kFusedRowsPerChunk)); }
// Ring depth: 8 rows up to C = 1536 (GPT-2 124M: 36 KiB per 96-thread block), 4 beyond (C = 4096: 96 KiB).
inline int fused_stages(int C) { return C <= 1536 ? 8 : 4; }
inline size_t fused_smem_bytes(int C, int stages) {
  return static_cast<size_t>(stages) * 3 * ceil_div(static_cast<size_t>(C), kFusedChannelsPerWarp) * kWarpSize * 16;
}

template <int kStages, class Loader>
__global__ void __launch_bounds__(kFusedMaxWarps * kWarpSize)
    layernorm_backward_fused_kernel(bf16* dinp, float* dinp_amax, float* dweight_partials, float* dbias_partials,
                                    float* dinp_sum_partials, const bf16* dout, const Loader inp, const bf16* weight,
                                    const float* mean, const float* rstd, int N, int C) {
  extern __shared__ x128 ring[];                          // (kStages, 3, blockDim.x): dout, x, dinp of a row
  __shared__ float2 row_stats[kFusedRowsPerChunk];        // (mean, rstd) of the chunk's rows
  __shared__ float2 warp_row_sums[2][kFusedMaxWarps];     // [row parity][warp]: (sum g, sum g * xhat)
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, num_warps = blockDim.x / kWarpSize;
  const int c = warp * kFusedChannelsPerWarp + lane * 8;
  const bool valid = c < C;
  const int row_begin = blockIdx.x * kFusedRowsPerChunk;
  const int rows = min(N - row_begin, kFusedRowsPerChunk);
  auto slot = [&](int stage, int array) { return &ring[(stage * 3 + array) * blockDim.x + threadIdx.x]; };
  auto fill = [&](int i) {  // row i of the chunk into stage i % kStages (nothing beyond the chunk); one group
    if (i < rows && valid) {
      const size_t at = static_cast<size_t>(row_begin + i) * C + c;
      const int stage = i % kStages;
      ptx::cp_async_16(ptx::smem_address(slot(stage, 0)), dout + at, true);
      inp.stage8_async(ptx::smem_address(slot(stage, 1)), at, row_begin + i, c);
      ptx::cp_async_16(ptx::smem_address(slot(stage, 2)), dinp + at, true);
    }
    ptx::cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages; i++) fill(i);
  if (threadIdx.x < rows) row_stats[threadIdx.x] = make_float2(mean[row_begin + threadIdx.x], rstd[row_begin + threadIdx.x]);
  x128 w;
  if (valid) w = load128(weight + c);
  __syncthreads();  // row_stats

  float dw[8] = {}, db[8] = {}, ds[8] = {};
  unsigned bits = 0;
  for (int i = 0; i < rows; i++) {
    ptx::cp_async_wait<kStages - 1>();  // this thread's copies of row i have landed (groups complete in order)
    const int stage = i % kStages;
    const float2 stats = row_stats[i];
    const float m = stats.x, s = stats.y;
    x128 d, di;
    typename Loader::Staged x;
    if (valid) {
      d = *slot(stage, 0);
      x = Loader::unstage8(slot(stage, 1));
      di = *slot(stage, 2);
    }
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    if (valid) {
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float dk = __bfloat162float(d[k]);
        const float xhat = (Loader::value(x, k) - m) * s;
        const float g = __bfloat162float(w[k]) * dk;
        sum_g += g;
        sum_g_xhat += g * xhat;
        dw[k] += dk * xhat;
        db[k] += dk;
      }
    }
    sum_g = warp_sum(sum_g);
    sum_g_xhat = warp_sum(sum_g_xhat);
    const int parity = i & 1;
    if (lane == 0) warp_row_sums[parity][warp] = make_float2(sum_g, sum_g_xhat);
    __syncthreads();
    float total_g = 0.0f, total_g_xhat = 0.0f;
    for (int v = 0; v < num_warps; v++) {  // the same order in every warp
      const float2 p = warp_row_sums[parity][v];
      total_g += p.x;
      total_g_xhat += p.y;
    }
    const float mean_g = total_g / C, mean_g_xhat = total_g_xhat / C;
    if (valid) {
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float g = __bfloat162float(w[k]) * __bfloat162float(d[k]);
        const float xhat = (Loader::value(x, k) - m) * s;
        di[k] = __float2bfloat16_rn(__bfloat162float(di[k]) + (g - mean_g - xhat * mean_g_xhat) * s);
        const float written = __bfloat162float(di[k]);
        bits = max(bits, amax_bits(fabsf(written)));
        ds[k] += written;
      }
      store128(dinp + static_cast<size_t>(row_begin + i) * C + c, di);
    }
    fill(i + kStages);  // into the stage just consumed (its values are in registers and used above)
  }
  ptx::cp_async_wait<0>();  // nothing left in flight (the groups past the chunk are empty)
  if (valid) {
    const size_t out = static_cast<size_t>(blockIdx.x) * C + c;
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int k = 4 * half;
      store128(dweight_partials + out + k, f128{{dw[k], dw[k + 1], dw[k + 2], dw[k + 3]}});
      store128(dbias_partials + out + k, f128{{db[k], db[k + 1], db[k + 2], db[k + 3]}});
      if (dinp_sum_partials != nullptr)
        store128(dinp_sum_partials + out + k, f128{{ds[k], ds[k + 1], ds[k + 2], ds[k + 3]}});
    }
  }
  report_row_amax(dinp_amax, bits, lane);
}

template <int kStages, class Loader>
void launch_layernorm_backward_fused(bf16* dinp, float* dinp_amax, float* dweight_partials, float* dbias_partials,
                                     float* dinp_sum_partials, const bf16* dout, const Loader inp, const bf16* weight,
                                     const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  const int threads = static_cast<int>(ceil_div(static_cast<size_t>(C), kFusedChannelsPerWarp)) * kWarpSize;
  const size_t smem = fused_smem_bytes(C, kStages);
  auto kernel = layernorm_backward_fused_kernel<kStages, Loader>;
  // dynamic + static shared memory above 48 KiB needs the opt-in (C = 1024 with 8 stages is 48 KiB dynamic alone)
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<num_fused_chunks(N), threads, smem, stream>>>(dinp, dinp_amax, dweight_partials, dbias_partials,
                                                          dinp_sum_partials, dout, inp, weight, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_scratch_floats(int N, int C) {
  const int chunks = C <= kFusedMaxC ? num_fused_chunks(N) : num_row_chunks(N);
  return 3 * static_cast<size_t>(chunks) * static_cast<size_t>(C);  // dweight, dbias, dinp_sum partials
}

// The backward passes and the column sums of their partials; inp: the loader of x.
template <class Loader>
void launch_layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                               const Loader inp, const bf16* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream, float* dinp_amax, float* dinp_sum) {
  const int num_chunks = C <= kFusedMaxC ? num_fused_chunks(N) : num_row_chunks(N);
  float* dweight_partials = scratch;                                       // (num_chunks, C)
  float* dbias_partials = scratch + static_cast<size_t>(num_chunks) * C;  // (num_chunks, C)
  float* dinp_sum_partials = dinp_sum ? scratch + 2 * static_cast<size_t>(num_chunks) * C : nullptr;  // (num_chunks, C)
  if (C <= kFusedMaxC) {  // one pass over dout, inp and dinp (GPT-2 up to XL: C <= 1600)
    auto fused = fused_stages(C) == 8 ? launch_layernorm_backward_fused<8, Loader>
                                      : launch_layernorm_backward_fused<4, Loader>;
    fused(dinp, dinp_amax, dweight_partials, dbias_partials, dinp_sum_partials, dout, inp, weight, mean, rstd, N, C,
          stream);
  } else {  // wider rows: one warp per row for dinp, then a column-parallel pass for the parameter partials
    layernorm_backward_dinp_kernel<<<static_cast<int>(ceil_div(N, kRowsPerBlock)), kRowsPerBlock * kWarpSize, 0,
                                     stream>>>(dinp, dinp_amax, dout, inp, weight, mean, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    const int block = 256;
    const size_t threads = static_cast<size_t>(num_chunks) * (C / 8);
    layernorm_param_partials_kernel<<<ceil_div(threads, block), block, 0, stream>>>(
        dweight_partials, dbias_partials, dout, inp, mean, rstd, N, C, num_chunks);
    CUDA_CHECK_LAUNCH();
    // dinp's column sums: the bias-gradient partials over the finished dinp (num_row_chunks(N) chunks as well)
    if (dinp_sum) column_partials(dinp_sum_partials, dinp, N, C, stream);
  }
  // the partials are consecutive (num_chunks, C) arrays: dweight, dbias (, dinp_sum), summed in one launch
  float* outs[3] = {dweight, dbias, dinp_sum};
  sum_column_partials(outs, dinp_sum ? 3 : 2, dweight_partials, num_chunks, C, stream);
}

static void check_layernorm_backward_args(const char* kernel, const bf16* dinp, const float* scratch,
                                          const bf16* dout, const bf16* weight, int C) {
  require_multiple_of_8(kernel, "C", C);
  require_aligned16(kernel, "dinp", dinp);
  require_aligned16(kernel, "scratch", scratch);
  require_aligned16(kernel, "dout", dout);
  require_aligned16(kernel, "weight", weight);
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream,
                        float* dinp_amax, float* dinp_sum) {
  const char* kernel = "layernorm_backward";
  check_layernorm_backward_args(kernel, dinp, scratch, dout, weight, C);
  require_aligned16(kernel, "inp", inp);
  if (N <= 0) return;
  launch_layernorm_backward(dinp, dweight, dbias, scratch, dout, Bf16Loader{inp}, weight, mean, rstd, N, C, stream,
                            dinp_amax, dinp_sum);
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                        const Fp8Groups& inp, const bf16* weight, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream, float* dinp_amax, float* dinp_sum) {
  const char* kernel = "layernorm_backward (fp8 input)";
  check_layernorm_backward_args(kernel, dinp, scratch, dout, weight, C);
  require_fp8_groups(kernel, "inp", inp.codes, inp.scale_inv, C);
  if (N <= 0) return;
  launch_layernorm_backward(dinp, dweight, dbias, scratch, dout, fp8_groups_loader(inp, N), weight, mean, rstd, N, C,
                            stream, dinp_amax, dinp_sum);
}

}  // namespace llmc
