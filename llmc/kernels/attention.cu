// llmc/kernels/attention.cu: causal scaled-dot-product attention, FlashAttention-2 style, on BF16 tensor cores
// (mma.sync m16n8k16 + ldmatrix, FP32 accumulation, FP32 online softmax), forward and deterministic backward, plus the
// CPU references (computed in double precision).
//
// Layouts (see llmc/kernels/):
//   qkv  (B, T, (NH + 2*NKV) * HS)   per token: NH query heads, then NKV key heads, then NKV value heads
//   out  (B, T, NH * HS)
//   lse  (B, NH, T)                  natural-log log-sum-exp of the scaled scores of each query row
// Query head h reads key/value head h / (NH / NKV). scale = 1/sqrt(HS). No (T, T) matrix is ever stored.
//
// Kernels (each CTA = 4 warps; each warp owns 16 rows of the CTA's 64-row tile):
//   forward      one CTA per (b, h, 64-query block); loops over key blocks 0..diagonal, online softmax in exp2 space.
//   bwd dsum     D[b,h,t] = sum_d dout * out (one warp per row), written into `scratch`.
//   bwd dK/dV    one CTA per (b, kv head, 64-key block); loops over every query head of the group and every query
//                block at or after the key block, recomputing P from Q, K and lse. Accumulates in registers, so the
//                GQA sum over the group has a fixed order: deterministic, no atomics.
//   bwd dQ       one CTA per (b, h, 64-query block); loops over key blocks 0..diagonal (recomputes P and dP again).
// Rows beyond T are zero-filled in shared memory (a NaN of uninitialised memory times P = 0 would still be NaN).
// On Hopper, head size 64 goes to the wgmma kernels of llmc/kernels/attention_sm90.cu instead (same math and layouts; the
// dsum kernel here serves both); set_attention_kernels(kPortable) forces these.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "llmc/kernels/attention_sm90.h"
#include "llmc/core/common.h"
#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/reduce.h"
#include "llmc/kernels/attention.h"
#include "llmc/kernels/attention_sm90.h"
#include "llmc/kernels/mma_ptx.cuh"

namespace llmc {
namespace {

using namespace ptx;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;                   // one m16 MMA row tile per warp
constexpr int kBlockRows = kWarps * kWarpRows;  // 64: query rows per CTA (forward, dQ) or key rows per CTA (dK/dV)
constexpr int kBlockKeys = 64;                  // keys per inner iteration (forward, dQ)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory tiles store HS bf16 per row plus 8 bf16 (16 bytes) of padding: the 8 row addresses of one ldmatrix
// phase then fall into 8 different 16-byte bank groups (no bank conflicts).
template <int HS>
constexpr int tile_stride() { return HS + 8; }

// Rows of the (dK/dV) inner query block: 64 for HS 64; 32 for HS 128 keeps the dK + dV accumulators (128 floats per
// thread) plus the two score tiles under the register limit.
// CTAs per SM the forward kernel is compiled for: 4 for HS 64 (128 registers, 6% faster on H100 than 2 at 147
// registers), 2 for HS 128 (4 would spill: 15% slower).
template <int HS>
constexpr int forward_min_blocks() { return HS == 64 ? 4 : 2; }

template <int HS>
constexpr int dkdv_query_rows() { return HS == 64 ? 64 : 32; }

// ---------------------------------------------------------------------------------------------------------------
// Warp-level tile products (one warp, 16 output rows)

// c (16, N) += A (16, K) * B^T, where A is 16 rows of a row-major shared tile (stride lda) and B is an (N, K) row-major
// shared tile (stride ldb). Used for Q K^T, dO V^T, K Q^T and V dO^T.
template <int N, int K>
__device__ __forceinline__ void warp_mma_abt(float (&c)[N / 8][4], const bf16* a, int lda, const bf16* b, int ldb) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    uint32_t a_frag[4];  // matrices: rows 0-7 / 8-15 x columns kk*16 + 0-7, then + 8-15
    ldmatrix_x4(a_frag, a + (lane % 16) * lda + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int nn = 0; nn < N / 16; nn++) {
      uint32_t b_frag[4];  // matrices: (B rows nn*16 + 0-7, k 0-7), (0-7, k 8-15), (8-15, k 0-7), (8-15, k 8-15)
      ldmatrix_x4(b_frag, b + (nn * 16 + lane % 8 + (lane / 16) * 8) * ldb + kk * 16 + ((lane / 8) % 2) * 8);
      mma_16816(c[2 * nn], a_frag, b_frag[0], b_frag[1]);
      mma_16816(c[2 * nn + 1], a_frag, b_frag[2], b_frag[3]);
    }
  }
}

// c (16, N) += A (16, K) * B, where A is held in registers in the accumulator layout of a previous warp_mma (an fp32
// (16, K) tile, K/8 column tiles; rounded to bf16 here) and B is a (K, N) row-major shared tile (stride ldb).
// Used for P V, P^T dO, dS^T Q and dS K.
template <int N, int K>
__device__ __forceinline__ void warp_mma_ab_regs(float (&c)[N / 8][4], const float (&a)[K / 8][4], const bf16* b,
                                                 int ldb) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    // accumulator tiles 2kk (columns 0-7) and 2kk+1 (columns 8-15) form the A fragment of this k-step
    uint32_t a_frag[4];
    accumulators_to_a_fragment(a_frag, a[2 * kk], a[2 * kk + 1]);
#pragma unroll
    for (int nn = 0; nn < N / 16; nn++) {
      uint32_t b_frag[4];  // transposed matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
      ldmatrix_x4_trans(b_frag, b + (kk * 16 + lane % 16) * ldb + nn * 16 + (lane / 16) * 8);
      mma_16816(c[2 * nn], a_frag, b_frag[0], b_frag[1]);
      mma_16816(c[2 * nn + 1], a_frag, b_frag[2], b_frag[3]);
    }
  }
}

// Copies rows [row0, row0 + ROWS) of one head (HS contiguous bf16 per row, consecutive rows `row_stride` elements
// apart) into a padded shared tile (ROWS, HS + 8). Rows at or beyond T are zero-filled. Asynchronous (cp.async).
template <int ROWS, int HS>
__device__ __forceinline__ void load_tile_async(bf16* tile, const bf16* head, int row0, int T, size_t row_stride) {
  constexpr int kChunksPerRow = HS / 8;  // 16-byte chunks
  constexpr int kChunks = ROWS * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile must split evenly over the CTA");
#pragma unroll
  for (int chunk = threadIdx.x; chunk < kChunks; chunk += kThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    const int t = row0 + row;
    const bool valid = t < T;
    const bf16* src = head + (size_t)(valid ? t : 0) * row_stride + col;
    cp_async_16(tile + row * tile_stride<HS>() + col, src, valid);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Forward

template <int HS>
constexpr size_t forward_smem_bytes() {  // Q tile + double-buffered K and V tiles
  return (size_t)(kBlockRows + 4 * kBlockKeys) * tile_stride<HS>() * sizeof(bf16);
}

// grid (B*NH, ceil(T/64)); blockIdx.y = 0 is the last (most expensive) query block.
template <int HS>
__global__ void __launch_bounds__(kThreads, forward_min_blocks<HS>()) attention_forward_kernel(bf16* out, float* lse, float* amax, const bf16* qkv, int T,
                                                                     int NH, int NKV) {
  constexpr int LD = tile_stride<HS>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem_raw);  // (64, LD)
  bf16* k_tiles = q_tile + kBlockRows * LD;          // 2 x (64, LD)
  bf16* v_tiles = k_tiles + 2 * kBlockKeys * LD;     // 2 x (64, LD)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int kv_head = h / (NH / NKV);
  const int num_q_blocks = (T + kBlockRows - 1) / kBlockRows;
  const int q_block = num_q_blocks - 1 - blockIdx.y;
  const int q0 = q_block * kBlockRows;
  const size_t qkv_stride = (size_t)(NH + 2 * NKV) * HS;
  const bf16* q_head = qkv + (size_t)b * T * qkv_stride + h * HS;                   // (T, HS) rows, stride qkv_stride
  const bf16* k_head = qkv + (size_t)b * T * qkv_stride + (NH + kv_head) * HS;
  const bf16* v_head = qkv + (size_t)b * T * qkv_stride + (NH + NKV + kv_head) * HS;

  load_tile_async<kBlockRows, HS>(q_tile, q_head, q0, T, qkv_stride);
  load_tile_async<kBlockKeys, HS>(k_tiles, k_head, 0, T, qkv_stride);
  load_tile_async<kBlockKeys, HS>(v_tiles, v_head, 0, T, qkv_stride);
  cp_async_commit();

  // this thread's two query rows: warp_row0 + lane/4 (accumulator elements 0,1) and + 8 (elements 2,3)
  const int warp_row0 = q0 + warp * kWarpRows;
  const float scale_log2 = kLog2e / sqrtf((float)HS);
  float o_acc[HS / 8][4] = {};                       // (16, HS) unnormalised output of this warp
  float row_max[2] = {-INFINITY, -INFINITY};         // running max of the log2-scaled scores
  float row_sum[2] = {0.f, 0.f};                     // this thread's share of the running sum of exp2(s - max)

  const int num_k_blocks = q_block + 1;  // causal: key blocks after the diagonal are fully masked, never visited
  for (int kb = 0; kb < num_k_blocks; kb++) {
    const int buf = kb % 2;
    if (kb + 1 < num_k_blocks) {  // prefetch the next key/value block into the other buffer
      load_tile_async<kBlockKeys, HS>(k_tiles + (1 - buf) * kBlockKeys * LD, k_head, (kb + 1) * kBlockKeys, T,
                                      qkv_stride);
      load_tile_async<kBlockKeys, HS>(v_tiles + (1 - buf) * kBlockKeys * LD, v_head, (kb + 1) * kBlockKeys, T,
                                      qkv_stride);
    }
    cp_async_commit();
    cp_async_wait<1>();  // everything but the prefetch just issued has landed
    __syncthreads();
    const bf16* k_tile = k_tiles + buf * kBlockKeys * LD;
    const bf16* v_tile = v_tiles + buf * kBlockKeys * LD;

    float s[kBlockKeys / 8][4] = {};  // (16, 64) scores of this warp's rows
    warp_mma_abt<kBlockKeys, HS>(s, q_tile + warp * kWarpRows * LD, LD, k_tile, LD);

    const bool diagonal = kb == q_block;
    const int k0 = kb * kBlockKeys;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kBlockKeys / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[nt][e] * scale_log2;
        if (diagonal) {
          const int key = k0 + nt * 8 + (lane % 4) * 2 + e % 2;
          const int query = warp_row0 + lane / 4 + (e / 2) * 8;
          if (key > query) x = -INFINITY;
        }
        s[nt][e] = x;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
      }
    }
    float max_used[2], correction[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const float new_max = fmaxf(row_max[r], quad_max(tile_max[r]));
      max_used[r] = new_max == -INFINITY ? 0.f : new_max;  // a fully masked row so far: keep exp2 finite
      correction[r] = exp2f(row_max[r] - max_used[r]);      // 0 on the first visit (row_max = -inf)
      row_max[r] = new_max;
    }
    float tile_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < kBlockKeys / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        s[nt][e] = exp2f(s[nt][e] - max_used[e / 2]);  // s now holds P (unnormalised)
        tile_sum[e / 2] += s[nt][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) row_sum[r] = row_sum[r] * correction[r] + tile_sum[r];
#pragma unroll
    for (int dt = 0; dt < HS / 8; dt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) o_acc[dt][e] *= correction[e / 2];
    }
    warp_mma_ab_regs<HS, kBlockKeys>(o_acc, s, v_tile, LD);  // O += P V
    __syncthreads();  // the next iteration's prefetch overwrites this buffer
  }

  unsigned out_bits = 0;  // max |out| written by this lane (FP8 amax, when asked for)
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = warp_row0 + lane / 4 + r * 8;
    const float total = quad_sum(row_sum[r]);
    if (t >= T) continue;
    const float inv = 1.f / total;
    bf16* out_row = out + ((size_t)b * T + t) * NH * HS + h * HS;
#pragma unroll
    for (int dt = 0; dt < HS / 8; dt++) {
      const int col = dt * 8 + (lane % 4) * 2;
      const __nv_bfloat162 o = __floats2bfloat162_rn(o_acc[dt][2 * r] * inv, o_acc[dt][2 * r + 1] * inv);
      *reinterpret_cast<__nv_bfloat162*>(out_row + col) = o;
      out_bits = max(out_bits, amax_bits(fmaxf(fabsf(__low2float(o)), fabsf(__high2float(o)))));
    }
    if (lane % 4 == 0) lse[((size_t)b * NH + h) * T + t] = (row_max[r] + log2f(total)) * kLn2;
  }
  if (amax != nullptr) {
    out_bits = warp_max_bits(out_bits);
    if (lane == 0) atomic_max_amax(amax, out_bits);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backward

// dsum (B, NH, T) = sum over d of dout * out, per query row (b, t, h). HS / 8 lanes per row, each loading 16 bytes
// of dout and of out (one 16-byte load per tensor per lane), then a fixed-order butterfly over those lanes.
template <int HS>
__global__ void attention_backward_dsum_kernel(float* dsum, const bf16* dout, const bf16* out, int B, int T, int NH) {
  constexpr int kLanesPerRow = HS / 8;
  const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t row = thread / kLanesPerRow;  // = (b*T + t)*NH + h; (B, T, NH*HS) is (B*T*NH, HS) row-major
  const int part = (int)(thread % kLanesPerRow);
  const bool valid = row < (size_t)B * T * NH;  // whole row groups share validity: no lane leaves a shuffle early
  float acc = 0.f;
  if (valid) {
    const uint4 d_bits = *reinterpret_cast<const uint4*>(dout + row * HS + part * 8);
    const uint4 o_bits = *reinterpret_cast<const uint4*>(out + row * HS + part * 8);
    const bf16* d = reinterpret_cast<const bf16*>(&d_bits);
    const bf16* o = reinterpret_cast<const bf16*>(&o_bits);
#pragma unroll
    for (int k = 0; k < 8; k++) acc += __bfloat162float(d[k]) * __bfloat162float(o[k]);
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (valid && part == 0) {
    const int h = (int)(row % NH);
    const size_t bt = row / NH;
    const size_t b = bt / T, t = bt % T;
    dsum[(b * NH + h) * T + t] = acc;
  }
}

template <int HS>
constexpr size_t dkdv_smem_bytes() {  // K, V tiles + double-buffered Q, dO tiles + double-buffered lse, dsum rows
  return (size_t)(2 * kBlockRows + 4 * dkdv_query_rows<HS>()) * tile_stride<HS>() * sizeof(bf16) +
         4 * dkdv_query_rows<HS>() * sizeof(float);
}

// grid (B*NKV, ceil(T/64)); blockIdx.y = key block (block 0 has the most queries after it, so it starts first).
// Writes dK and dV (bf16) of kv head `kv_head` for the CTA's 64 keys into dqkv.
template <int HS>
__global__ void __launch_bounds__(kThreads) attention_backward_dkdv_kernel(bf16* dqkv, float* amax,
                                                                           const bf16* dout, const bf16* qkv,
                                                                           const float* lse, const float* dsum, int T,
                                                                           int NH, int NKV) {
  constexpr int LD = tile_stride<HS>();
  constexpr int BQ = dkdv_query_rows<HS>();
  static_assert(kBlockRows % BQ == 0, "query blocks must tile the key block");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* k_tile = reinterpret_cast<bf16*>(smem_raw);  // (64, LD)
  bf16* v_tile = k_tile + kBlockRows * LD;           // (64, LD)
  bf16* q_tiles = v_tile + kBlockRows * LD;          // 2 x (BQ, LD)
  bf16* do_tiles = q_tiles + 2 * BQ * LD;            // 2 x (BQ, LD)
  float* lse_rows = reinterpret_cast<float*>(do_tiles + 2 * BQ * LD);  // 2 x (BQ): lse * log2(e); +inf beyond T
  float* dsum_rows = lse_rows + 2 * BQ;                                 // 2 x (BQ): D; 0 beyond T

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NKV, kv_head = blockIdx.x % NKV;
  const int group = NH / NKV;
  const int k0 = blockIdx.y * kBlockRows;
  const size_t qkv_stride = (size_t)(NH + 2 * NKV) * HS;
  const size_t out_stride = (size_t)NH * HS;
  const bf16* qkv_b = qkv + (size_t)b * T * qkv_stride;
  const bf16* dout_b = dout + (size_t)b * T * out_stride;

  // iterations: every (query head of the group, query block at or after the key block), head-major: a fixed order
  const int first_q_block = k0 / BQ;
  const int q_blocks_per_head = (T + BQ - 1) / BQ - first_q_block;
  const int num_iters = group * q_blocks_per_head;
  auto issue_loads = [&](int it, int buf) {
    const int h = kv_head * group + it / q_blocks_per_head;
    const int qr0 = (first_q_block + it % q_blocks_per_head) * BQ;
    load_tile_async<BQ, HS>(q_tiles + buf * BQ * LD, qkv_b + h * HS, qr0, T, qkv_stride);
    load_tile_async<BQ, HS>(do_tiles + buf * BQ * LD, dout_b + h * HS, qr0, T, out_stride);
    for (int i = threadIdx.x; i < BQ; i += kThreads) {
      const int t = qr0 + i;
      const size_t row = ((size_t)b * NH + h) * T + t;
      lse_rows[buf * BQ + i] = t < T ? lse[row] * kLog2e : INFINITY;  // +inf makes P = 0 for padding rows
      dsum_rows[buf * BQ + i] = t < T ? dsum[row] : 0.f;
    }
  };

  load_tile_async<kBlockRows, HS>(k_tile, qkv_b + (NH + kv_head) * HS, k0, T, qkv_stride);
  load_tile_async<kBlockRows, HS>(v_tile, qkv_b + (NH + NKV + kv_head) * HS, k0, T, qkv_stride);
  issue_loads(0, 0);
  cp_async_commit();

  // this thread's two key rows: k0 + warp*16 + lane/4 (accumulator elements 0,1) and + 8 (elements 2,3)
  const int warp_key0 = k0 + warp * kWarpRows;
  const float scale_log2 = kLog2e / sqrtf((float)HS);
  float dk_acc[HS / 8][4] = {};  // (16, HS) of this warp's keys, unscaled
  float dv_acc[HS / 8][4] = {};

  for (int it = 0; it < num_iters; it++) {
    const int buf = it % 2;
    if (it + 1 < num_iters) issue_loads(it + 1, 1 - buf);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* q_tile = q_tiles + buf * BQ * LD;
    const bf16* do_tile = do_tiles + buf * BQ * LD;
    const float* lse_tile = lse_rows + buf * BQ;
    const float* dsum_tile = dsum_rows + buf * BQ;
    const int qr0 = (first_q_block + it % q_blocks_per_head) * BQ;

    float pt[BQ / 8][4] = {};  // (16 keys, BQ queries): S^T, then P^T
    warp_mma_abt<BQ, HS>(pt, k_tile + warp * kWarpRows * LD, LD, q_tile, LD);
    float dst[BQ / 8][4] = {};  // (16 keys, BQ queries): dP^T = V dO^T, then dS^T
    warp_mma_abt<BQ, HS>(dst, v_tile + warp * kWarpRows * LD, LD, do_tile, LD);

    const bool needs_mask = qr0 < k0 + kBlockRows;  // some query of this block precedes some key of the CTA
#pragma unroll
    for (int nt = 0; nt < BQ / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = nt * 8 + (lane % 4) * 2 + e % 2;  // query within the block
        float p = exp2f(pt[nt][e] * scale_log2 - lse_tile[col]);
        if (needs_mask && warp_key0 + lane / 4 + (e / 2) * 8 > qr0 + col) p = 0.f;
        pt[nt][e] = p;
        dst[nt][e] = p * (dst[nt][e] - dsum_tile[col]);
      }
    }
    warp_mma_ab_regs<HS, BQ>(dv_acc, pt, do_tile, LD);  // dV += P^T dO
    warp_mma_ab_regs<HS, BQ>(dk_acc, dst, q_tile, LD);  // dK += dS^T Q
    __syncthreads();
  }

  const float scale = 1.f / sqrtf((float)HS);
  bf16* dqkv_b = dqkv + (size_t)b * T * qkv_stride;
  unsigned bits = 0;  // max |dK|, |dV| written by this lane (FP8 amax, when asked for)
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = warp_key0 + lane / 4 + r * 8;
    if (t >= T) continue;
    bf16* dk_row = dqkv_b + (size_t)t * qkv_stride + (NH + kv_head) * HS;
    bf16* dv_row = dqkv_b + (size_t)t * qkv_stride + (NH + NKV + kv_head) * HS;
#pragma unroll
    for (int dt = 0; dt < HS / 8; dt++) {
      const int col = dt * 8 + (lane % 4) * 2;
      const __nv_bfloat162 dk = __floats2bfloat162_rn(dk_acc[dt][2 * r] * scale, dk_acc[dt][2 * r + 1] * scale);
      const __nv_bfloat162 dv = __floats2bfloat162_rn(dv_acc[dt][2 * r], dv_acc[dt][2 * r + 1]);
      *reinterpret_cast<__nv_bfloat162*>(dk_row + col) = dk;
      *reinterpret_cast<__nv_bfloat162*>(dv_row + col) = dv;
      bits = max(bits, amax_bits(fmaxf(fmaxf(fabsf(__low2float(dk)), fabsf(__high2float(dk))),
                                       fmaxf(fabsf(__low2float(dv)), fabsf(__high2float(dv))))));
    }
  }
  if (amax != nullptr) {
    bits = warp_max_bits(bits);
    if (lane == 0) atomic_max_amax(amax, bits);
  }
}

template <int HS>
constexpr size_t dq_smem_bytes() {  // Q, dO tiles + double-buffered K, V tiles
  return (size_t)(2 * kBlockRows + 4 * kBlockKeys) * tile_stride<HS>() * sizeof(bf16);
}

// grid (B*NH, ceil(T/64)); blockIdx.y = 0 is the last query block. Writes dQ (bf16) of head h into dqkv.
template <int HS>
__global__ void __launch_bounds__(kThreads) attention_backward_dq_kernel(bf16* dqkv, float* amax,
                                                                         const bf16* dout, const bf16* qkv,
                                                                         const float* lse, const float* dsum, int T,
                                                                         int NH, int NKV) {
  constexpr int LD = tile_stride<HS>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem_raw);  // (64, LD)
  bf16* do_tile = q_tile + kBlockRows * LD;          // (64, LD)
  bf16* k_tiles = do_tile + kBlockRows * LD;         // 2 x (64, LD)
  bf16* v_tiles = k_tiles + 2 * kBlockKeys * LD;     // 2 x (64, LD)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int kv_head = h / (NH / NKV);
  const int num_q_blocks = (T + kBlockRows - 1) / kBlockRows;
  const int q_block = num_q_blocks - 1 - blockIdx.y;
  const int q0 = q_block * kBlockRows;
  const size_t qkv_stride = (size_t)(NH + 2 * NKV) * HS;
  const size_t out_stride = (size_t)NH * HS;
  const bf16* qkv_b = qkv + (size_t)b * T * qkv_stride;
  const bf16* k_head = qkv_b + (NH + kv_head) * HS;
  const bf16* v_head = qkv_b + (NH + NKV + kv_head) * HS;

  load_tile_async<kBlockRows, HS>(q_tile, qkv_b + h * HS, q0, T, qkv_stride);
  load_tile_async<kBlockRows, HS>(do_tile, dout + (size_t)b * T * out_stride + h * HS, q0, T, out_stride);
  load_tile_async<kBlockKeys, HS>(k_tiles, k_head, 0, T, qkv_stride);
  load_tile_async<kBlockKeys, HS>(v_tiles, v_head, 0, T, qkv_stride);
  cp_async_commit();

  // this thread's two query rows: warp_row0 + lane/4 (accumulator elements 0,1) and + 8 (elements 2,3)
  const int warp_row0 = q0 + warp * kWarpRows;
  float lse_log2[2], row_dsum[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = warp_row0 + lane / 4 + r * 8;
    const size_t row = ((size_t)b * NH + h) * T + t;
    lse_log2[r] = t < T ? lse[row] * kLog2e : 0.f;  // padding rows compute finite garbage that is never written
    row_dsum[r] = t < T ? dsum[row] : 0.f;
  }
  const float scale_log2 = kLog2e / sqrtf((float)HS);
  float dq_acc[HS / 8][4] = {};  // (16, HS) of this warp's queries, unscaled

  const int num_k_blocks = q_block + 1;
  for (int kb = 0; kb < num_k_blocks; kb++) {
    const int buf = kb % 2;
    if (kb + 1 < num_k_blocks) {
      load_tile_async<kBlockKeys, HS>(k_tiles + (1 - buf) * kBlockKeys * LD, k_head, (kb + 1) * kBlockKeys, T,
                                      qkv_stride);
      load_tile_async<kBlockKeys, HS>(v_tiles + (1 - buf) * kBlockKeys * LD, v_head, (kb + 1) * kBlockKeys, T,
                                      qkv_stride);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* k_tile = k_tiles + buf * kBlockKeys * LD;
    const bf16* v_tile = v_tiles + buf * kBlockKeys * LD;

    float ds[kBlockKeys / 8][4] = {};  // (16, 64): S, then dS
    warp_mma_abt<kBlockKeys, HS>(ds, q_tile + warp * kWarpRows * LD, LD, k_tile, LD);
    float dp[kBlockKeys / 8][4] = {};  // (16, 64): dP = dO V^T
    warp_mma_abt<kBlockKeys, HS>(dp, do_tile + warp * kWarpRows * LD, LD, v_tile, LD);

    const bool diagonal = kb == q_block;
    const int k0 = kb * kBlockKeys;
#pragma unroll
    for (int nt = 0; nt < kBlockKeys / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = exp2f(ds[nt][e] * scale_log2 - lse_log2[e / 2]);
        if (diagonal && k0 + nt * 8 + (lane % 4) * 2 + e % 2 > warp_row0 + lane / 4 + (e / 2) * 8) p = 0.f;
        ds[nt][e] = p * (dp[nt][e] - row_dsum[e / 2]);
      }
    }
    warp_mma_ab_regs<HS, kBlockKeys>(dq_acc, ds, k_tile, LD);  // dQ += dS K
    __syncthreads();
  }

  const float scale = 1.f / sqrtf((float)HS);
  unsigned bits = 0;  // max |dQ| written by this lane (FP8 amax, when asked for)
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = warp_row0 + lane / 4 + r * 8;
    if (t >= T) continue;
    bf16* dq_row = dqkv + ((size_t)b * T + t) * qkv_stride + h * HS;
#pragma unroll
    for (int dt = 0; dt < HS / 8; dt++) {
      const int col = dt * 8 + (lane % 4) * 2;
      const __nv_bfloat162 dq = __floats2bfloat162_rn(dq_acc[dt][2 * r] * scale, dq_acc[dt][2 * r + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dq_row + col) = dq;
      bits = max(bits, amax_bits(fmaxf(fabsf(__low2float(dq)), fabsf(__high2float(dq)))));
    }
  }
  if (amax != nullptr) {
    bits = warp_max_bits(bits);
    if (lane == 0) atomic_max_amax(amax, bits);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Host-side checks and dispatch

void check_attention_shape(const char* who, int B, int T, int NH, int NKV, int HS, bool gpu) {
  if (B < 1 || T < 1 || NH < 1 || NKV < 1 || HS < 1)
    throw_error("%s: B=%d, T=%d, n_head=%d, n_kv_head=%d, head_size=%d must all be positive", who, B, T, NH, NKV, HS);
  if (NH % NKV != 0)
    throw_error("%s: n_kv_head=%d must divide n_head=%d (grouped-query attention); check the model config", who, NKV,
                NH);
  if (gpu && HS != 64 && HS != 128)
    throw_error("%s: head_size=%d is not supported by the attention kernels (64 or 128); choose n_embd / n_head "
                "accordingly",
                who, HS);
}

void check_aligned16(const char* who, const char* name, const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    throw_error("%s: %s must be 16-byte aligned (the kernels use 16-byte vector copies); allocate it with "
                "cudaMalloc or at a 16-byte multiple offset",
                who, name);
}

template <typename Kernel>
void set_dynamic_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int HS>
void launch_forward(bf16* out, float* lse, float* amax, const bf16* qkv, int B, int T, int NH, int NKV,
                    cudaStream_t stream) {
  const size_t smem = forward_smem_bytes<HS>();
  set_dynamic_smem(attention_forward_kernel<HS>, smem);
  const dim3 grid(B * NH, (T + kBlockRows - 1) / kBlockRows);
  attention_forward_kernel<HS><<<grid, kThreads, smem, stream>>>(out, lse, amax, qkv, T, NH, NKV);
  CUDA_CHECK_LAUNCH();
}

template <int HS>
void launch_backward(bf16* dqkv, float* amax, const float* dsum, const bf16* dout, const bf16* qkv, const float* lse,
                     int B, int T, int NH, int NKV, cudaStream_t stream) {
  const int num_blocks = (T + kBlockRows - 1) / kBlockRows;
  const size_t dkdv_smem = dkdv_smem_bytes<HS>();
  set_dynamic_smem(attention_backward_dkdv_kernel<HS>, dkdv_smem);
  attention_backward_dkdv_kernel<HS><<<dim3(B * NKV, num_blocks), kThreads, dkdv_smem, stream>>>(
      dqkv, amax, dout, qkv, lse, dsum, T, NH, NKV);
  CUDA_CHECK_LAUNCH();
  const size_t dq_smem = dq_smem_bytes<HS>();
  set_dynamic_smem(attention_backward_dq_kernel<HS>, dq_smem);
  attention_backward_dq_kernel<HS><<<dim3(B * NH, num_blocks), kThreads, dq_smem, stream>>>(
      dqkv, amax, dout, qkv, lse, dsum, T, NH, NKV);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Public API (llmc/kernels/attention.h)

namespace {
AttentionKernels g_attention_kernels = AttentionKernels::kAuto;
bool use_sm90_kernels(int HS) {
  return HS == 64 && g_attention_kernels == AttentionKernels::kAuto && attention_sm90_available();
}
}  // namespace

void set_attention_kernels(AttentionKernels which) { g_attention_kernels = which; }

const char* attention_kernels_name(int HS) { return use_sm90_kernels(HS) ? "sm90 wgmma" : "mma.sync"; }

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV, int HS,
                       cudaStream_t stream, float* out_amax) {
  check_attention_shape("attention_forward", B, T, NH, NKV, HS, true);
  check_aligned16("attention_forward", "qkv", qkv);
  check_aligned16("attention_forward", "out", out);
  if (use_sm90_kernels(HS)) attention_forward_sm90(out, lse, out_amax, qkv, B, T, NH, NKV, stream);
  else if (HS == 64) launch_forward<64>(out, lse, out_amax, qkv, B, T, NH, NKV, stream);
  else launch_forward<128>(out, lse, out_amax, qkv, B, T, NH, NKV, stream);
}

// scratch = dsum (B, NH, T), padded to 4 floats, then (with a bias gradient) the column partials of dqkv.
static size_t dsum_floats(int B, int T, int NH) { return ((size_t)B * NH * T + 3) / 4 * 4; }

size_t attention_backward_scratch_floats(int B, int T, int NH, int HS, bool qkv_bias_grad) {
  // dK/dV/dQ themselves need no scratch (register accumulation, fixed order)
  if (!qkv_bias_grad) return dsum_floats(B, T, NH);
  const size_t width = (size_t)3 * NH * HS;  // NH + 2*NKV <= 3*NH heads
  const size_t rows = std::max<size_t>(num_row_chunks(B * T), (size_t)B * ceil_div((size_t)T, (size_t)128));
  return dsum_floats(B, T, NH) + rows * width;
}

void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS, cudaStream_t stream,
                        float* dqkv_amax, float* dbias) {
  check_attention_shape("attention_backward", B, T, NH, NKV, HS, true);
  check_aligned16("attention_backward", "dqkv", dqkv);
  check_aligned16("attention_backward", "dout", dout);
  check_aligned16("attention_backward", "qkv", qkv);
  check_aligned16("attention_backward", "scratch", scratch);
  float* dsum = scratch;                                      // (B, NH, T)
  float* bias_partials = scratch + dsum_floats(B, T, NH);     // (rows, (NH + 2*NKV) * HS) when dbias is given
  const int width = (NH + 2 * NKV) * HS;
  const size_t rows = (size_t)B * T * NH;
  check_aligned16("attention_backward", "out", out);
  const int threads = 256;
  if (HS == 64) {
    attention_backward_dsum_kernel<64><<<(unsigned)ceil_div(rows * 8, threads), threads, 0, stream>>>(dsum, dout, out,
                                                                                                    B, T, NH);
  } else {
    attention_backward_dsum_kernel<128><<<(unsigned)ceil_div(rows * 16, threads), threads, 0, stream>>>(dsum, dout,
                                                                                                      out, B, T, NH);
  }
  CUDA_CHECK_LAUNCH();
  if (use_sm90_kernels(HS)) {  // the sm90 kernels write the bias partials of their rows as they store dqkv
    attention_backward_sm90(dqkv, dqkv_amax, dbias ? bias_partials : nullptr, dsum, dout, qkv, lse, B, T, NH, NKV,
                            stream);
    if (dbias) sum_column_partials(dbias, bias_partials, attention_sm90_bias_partial_rows(B, T), width, stream);
    return;
  }
  if (HS == 64) launch_backward<64>(dqkv, dqkv_amax, dsum, dout, qkv, lse, B, T, NH, NKV, stream);
  else launch_backward<128>(dqkv, dqkv_amax, dsum, dout, qkv, lse, B, T, NH, NKV, stream);
  if (dbias) {  // a pass over the finished dqkv
    column_partials(bias_partials, dqkv, B * T, width, stream);
    sum_column_partials(dbias, bias_partials, num_row_chunks(B * T), width, stream);
  }
}

}  // namespace llmc
