// llmc/precision/fp8_quant.cu: the FP8 quantisation kernels of llmc/precision/fp8_quant.h, bit-exact with their host
// references (test/reference/quant_ref.cpp): the same codes, scales and amax. Owns the delayed-scaling update, amax of
// a bf16 tensor, the per-tensor and block-wise casts (one pass over x, writing the row-major codes and the transposed
// copy together), the transpose of codes, dequantisation and the quantisation telemetry; the scale formulas are
// llmc/precision/scale_math.cuh's, which the references share.
//
// Bit-exactness rests on three things: the FP32 arithmetic of the scale formula and of x * scale is written with
// explicitly rounded operations (__fdiv_rn, __fmul_rn on the device: no FMA contraction, no approximate division;
// plain IEEE operations on the host); the device conversion is cvt.rn.satfinite (__nv_cvt_float2_to_fp8x2 with
// __NV_SATFINITE), which the host fp8_encode reproduces exactly (test/core/test_dtypes, test/precision/test_quant); and
// every amax is a max over the bits of |x| (order independent, NaN-propagating), as llmc/core/cuda_utils.cuh explains.
//
// The cast kernel: one CTA of 256 threads owns a 128 x 128 tile of x (tiles in row-major order over the grid). It
// reads the tile once with 16-byte loads into registers (thread t holds the 8 bf16 of chunk t % 16 of rows
// t / 16 + 16 s, s = 0..7), reduces the 1x128 row amaxes with shuffles across the 16 lanes sharing a row, writes the
// row-major codes from registers (8 bytes per thread, a warp writes two contiguous 128-byte row segments), and, when a
// transposed copy is wanted, stages the bf16 tile in shared memory (32 KB, XOR-swizzled 16-byte chunks so the column
// reads are free of bank conflicts) and writes data_t from it: each lane converts 16 consecutive rows of one column
// (the 128 x 1 block amax is a shuffle across the 8 lanes of that column) into one 16-byte store, a warp writing four
// contiguous 128-byte segments of data_t. Traffic: x read once, data and data_t written once.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include <cuda_fp8.h>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/quantize.h"
#include "llmc/precision/scale_math.cuh"

#if defined(__CUDACC__) && defined(__USE_FAST_MATH__)
#error "llmc/precision/fp8_quant.cu must be compiled without --use_fast_math: host and device scales must agree bit for bit"
#endif

namespace llmc {

// ---------------------------------------------------------------------------------------------------------------
// The family's encodings
bool fp8_tensorwise_encoding(const Encoding& e) {
  return is_fp8(e.element) && e.per_tensor() && (e.scale == ScaleFormat::FP32 || e.scale == ScaleFormat::Pow2FP32) &&
         !e.tensor_scale;
}

bool fp8_blockwise_encoding(const Encoding& e) {
  return is_fp8(e.element) && (e.block == kBlock1x128 || e.block == kBlock128x128) &&
         (e.scale == ScaleFormat::FP32 || e.scale == ScaleFormat::Pow2FP32) && !e.tensor_scale;
}

static const char* const kTensorwiseDoc = "an e4m3 | e5m2 encoding with one fp32 | pow2 scale for the whole tensor";
static const char* const kBlockwiseDoc = "an e4m3 | e5m2 encoding with fp32 | pow2 scales of 1x128 or 128x128 blocks";

// ---------------------------------------------------------------------------------------------------------------
// Scales
__global__ void fp8_scale_from_amax_kernel(float* scale, float* scale_inv, const float* amax, float fp8max,
                                           float margin_factor, bool pow2) {
  const float s = scale_from_amax(amax[0], scale[0], fp8max, margin_factor, pow2);
  scale[0] = s;
  scale_inv[0] = div_rn(1.0f, s);
}

void fp8_scale_from_amax(float* scale, float* scale_inv, const float* amax, const Encoding& e, int margin,
                         cudaStream_t stream) {
  const float mf = margin_factor("fp8_scale_from_amax", margin);
  if (!fp8_tensorwise_encoding(e))
    throw_error("fp8_scale_from_amax: e is %s; per-tensor scales are for %s", encoding_name(e).c_str(), kTensorwiseDoc);
  if (!scale || !scale_inv || !amax)
    throw_error("fp8_scale_from_amax: scale (%p), scale_inv (%p) and amax (%p) must all be device pointers",
                static_cast<void*>(scale), static_cast<void*>(scale_inv), static_cast<const void*>(amax));
  fp8_scale_from_amax_kernel<<<1, 1, 0, stream>>>(scale, scale_inv, amax, fp8_max_of(e.element), mf,
                                                  e.pow2_scales());
  CUDA_CHECK_LAUNCH();
}

// Delayed scaling: one warp per tensor. The max over the history ignores NaN entries (fmaxf, as Transformer Engine)
// and is order independent, so the warp's butterfly gives the host's sequential result; an infinite entry wins and
// keeps the previous scale until it leaves the window. formats[i] == 1 (E5M2) selects 57344, anything else 448.
constexpr int kDelayedWarpsPerBlock = 8;

__global__ void fp8_delayed_scaling_update_kernel(float* history, float* amax, float* scale, float* scale_inv,
                                                  const uint8_t* formats, int count, int len, int pos, bool use_max,
                                                  float margin_factor, bool pow2) {
  const int lane = threadIdx.x % kWarpSize;
  const int i = blockIdx.x * kDelayedWarpsPerBlock + threadIdx.x / kWarpSize;
  if (i >= count) return;
  float* h = history + static_cast<size_t>(i) * len;
  const float a = amax[i];
  float m = a;
  if (use_max) {
    m = 0.0f;
    for (int k = lane; k < len; k += kWarpSize) m = fmaxf(m, k == pos ? a : h[k]);
    m = warp_max(m);
  }
  if (lane == 0) {
    h[pos] = a;
    amax[i] = 0.0f;
    const float s = scale_from_amax(m, scale[i], fp8_max_of(static_cast<ElementFormat>(formats[i])), margin_factor,
                                    pow2);
    scale[i] = s;
    scale_inv[i] = div_rn(1.0f, s);
  }
}

void fp8_delayed_scaling_update(float* history, float* amax, float* scale, float* scale_inv, const uint8_t* formats,
                                int count, int len, int pos, bool use_max, int margin, ScaleFormat scales,
                                cudaStream_t stream) {
  const char* kernel = "fp8_delayed_scaling_update";
  const float mf = margin_factor(kernel, margin);
  check_delayed_scaling_args(kernel, history, amax, scale, scale_inv, formats, count, len, pos, scales);
  if (count == 0) return;
  const int blocks = static_cast<int>(ceil_div(count, kDelayedWarpsPerBlock));
  fp8_delayed_scaling_update_kernel<<<blocks, kDelayedWarpsPerBlock * kWarpSize, 0, stream>>>(
      history, amax, scale, scale_inv, formats, count, len, pos, use_max, mf, scales == ScaleFormat::Pow2FP32);
  CUDA_CHECK_LAUNCH();
}

// max |x| of 8 bf16 as the FP32 bits of |x| (what amax_bits gives): a bf16 is the top half of an FP32, so |x| orders
// exactly like the low 15 bits of its bf16 pattern (NaN above inf, as for FP32), and __vmaxu2 maxes two of them at
// once. No conversion to FP32 (so no 64 live floats in the cast kernel).
//
// The cast kernel holds x as raw 16-byte words (uint4: bf16 pairs, the lower address in the low half), not as x128:
// a conditionally zero-filled x128 makes the compiler keep each bf16 in its own register (64 instead of 32 per
// thread). bf16_lo / bf16_hi unpack a pair exactly (a bf16 is the top half of an FP32).
__device__ inline float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ inline float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }
__device__ inline uint32_t word(const uint4& w, int i) { return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w; }
__device__ inline unsigned amax_bits8(const uint4& w) {
  const unsigned m = __vmaxu2(__vmaxu2(w.x & 0x7fff7fffu, w.y & 0x7fff7fffu), __vmaxu2(w.z & 0x7fff7fffu, w.w & 0x7fff7fffu));
  return max(m & 0xffffu, m >> 16) << 16;
}

// ---------------------------------------------------------------------------------------------------------------
// amax of a bf16 tensor: a fixed grid strides over 16-byte chunks (the n % 8 tail element-wise), one atomic per block.
constexpr int kAmaxThreads = 512;
constexpr int kAmaxMaxBlocks = 1024;

__global__ void __launch_bounds__(kAmaxThreads) amax_bf16_kernel(float* amax, const bf16* x, size_t n) {
  __shared__ unsigned warp_amax[kAmaxThreads / kWarpSize];
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t n8 = n / 8;
  unsigned m = 0;
  for (size_t i = thread; i < n8; i += stride) {
    m = max(m, amax_bits8(__ldcs(reinterpret_cast<const uint4*>(x + 8 * i))));
  }
  for (size_t i = 8 * n8 + thread; i < n; i += stride) m = max(m, amax_bits(fabsf(__bfloat162float(x[i]))));
  m = warp_max_bits(m);
  if (threadIdx.x % kWarpSize == 0) warp_amax[threadIdx.x / kWarpSize] = m;
  __syncthreads();
  if (threadIdx.x < kWarpSize) {
    m = threadIdx.x < kAmaxThreads / kWarpSize ? warp_amax[threadIdx.x] : 0u;
    m = warp_max_bits(m);
    if (threadIdx.x == 0) atomic_max_amax(amax, m);
  }
}

void amax_bf16(float* amax, const bf16* x, size_t n, cudaStream_t stream) {
  if (!amax) throw_error("amax_bf16: amax must be a device pointer (got null)");
  if (n == 0) return;
  if (!x) throw_error("amax_bf16: x is null (n = %zu)", n);
  require_aligned16("amax_bf16", "x", x);
  const int blocks = static_cast<int>(std::min<size_t>(kAmaxMaxBlocks, std::max<size_t>(1, ceil_div(n / 8, kAmaxThreads))));
  amax_bf16_kernel<<<blocks, kAmaxThreads, 0, stream>>>(amax, x, n);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------------------
// The cast kernel (the tile scheme is described at the top of this file).
constexpr int kTile = kBlock128x128.rows;                     // 128 x 128 elements per CTA (a tile of 1x128 blocks)
constexpr int kTileThreads = 256;
constexpr int kTileWarps = kTileThreads / kWarpSize;          // 8
constexpr int kTileChunks = kTile / 8;                        // 16-byte chunks (8 bf16) per tile row: 16
constexpr int kTileRowsPerStep = kTileThreads / kTileChunks;  // rows loaded per step: 16
constexpr int kTileSteps = kTile / kTileRowsPerStep;          // load steps: 8 (thread rows r = t / 16 + 16 s)
constexpr int kColLanes = 8;                                  // column pass: lanes per column (16 rows each)
constexpr int kColsPerWarp = kWarpSize / kColLanes;           // columns a warp converts at once: 4
constexpr int kColPasses = kTile / (kTileWarps * kColsPerWarp);  // 4
static_assert(kTileSteps == 8 && kColLanes * 16 == kTile && kColPasses * kTileWarps * kColsPerWarp == kTile,
              "the swizzle key r / 16 must be the load step and the column lane, both in 0..7");
static_assert(kBlock1x128.cols == kTile && kBlock128x128.cols == kTile, "a tile row is one 1x128 block");

enum class TileMode : int { Tensor, Block1x128, Block128x128 };

struct TileArgs {
  const bf16* x;         // (rows, cols)
  uint8_t* data;         // (rows, cols) codes, or null
  uint8_t* data_t;       // (cols, rows) codes, or null
  const float* scale;    // Tensor: (1) the multiplier (with amax_in: the previous one, kept for a 0 / non-finite amax)
  const float* amax_in;  // Tensor, current scaling in one launch: (1) the amax the multiplier comes from, or null
  float* scale_out;      //   with amax_in: where block 0 writes the multiplier and its inverse (the slot's scale,
  float* scale_inv_out;  //   scale_inv; every block computes the same value, so none waits for block 0)
  float margin_factor;   //   with amax_in: 2^margin
  float* scale_inv;      // blocks: data's GEMM-ready scales (ld)
  float* scale_inv_t;    // blocks: data_t's GEMM-ready scales (ld_t)
  float* amax;           // atomic max of max |x| (bits), or null
  int rows, cols;
  int row_tiles, col_tiles;
  int ld, ld_t;
  bool pow2;
  bool vec_t;            // rows % 16 == 0: every 16-row run of a data_t row is 16-byte aligned (else byte stores)
};

template <ElementFormat F>
__device__ inline uint32_t cvt4(float a, float b, float c, float d) {  // four codes, a in the low byte
  constexpr __nv_fp8_interpretation_t kind = F == ElementFormat::E4M3 ? __NV_E4M3 : __NV_E5M2;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kind);
  return lo | (hi << 16);
}

// Row-major codes of the thread's 8 rows (8 codes per row, straight from registers) and, for 1x128, the rows' scale_inv
// (rows past the tensor up to ld are padding: their amax is 0, so their scale_inv is 1).
template <TileMode kMode, ElementFormat kFormat>
__device__ __forceinline__ void store_row_codes(const TileArgs& a, const uint4 (&v)[kTileSteps],
                                                const unsigned (&row_amax)[kTileSteps], float tile_scale, int r0,
                                                int c0, int ct, int row0, int k, int tile_rows, bool chunk_in) {
  constexpr float kMax = kFormat == ElementFormat::E4M3 ? 448.0f : 57344.0f;
#pragma unroll
  for (int s = 0; s < kTileSteps; s++) {
    const int r = row0 + kTileRowsPerStep * s;
    const float sc =
        kMode == TileMode::Block1x128 ? block_scale(bits_to_float(row_amax[s]), kMax, a.pow2) : tile_scale;
    if (chunk_in && r < tile_rows) {
      float f[8];
#pragma unroll
      for (int q = 0; q < 4; q++) {
        f[2 * q] = mul_rn(bf16_lo(word(v[s], q)), sc);
        f[2 * q + 1] = mul_rn(bf16_hi(word(v[s], q)), sc);
      }
      const uint2 codes = make_uint2(cvt4<kFormat>(f[0], f[1], f[2], f[3]), cvt4<kFormat>(f[4], f[5], f[6], f[7]));
      *reinterpret_cast<uint2*>(a.data + static_cast<size_t>(r0 + r) * a.cols + c0 + 8 * k) = codes;
    }
    if (kMode == TileMode::Block1x128 && k == 0 && r0 + r < a.ld)
      a.scale_inv[static_cast<size_t>(ct) * a.ld + r0 + r] = div_rn(1.0f, sc);
  }
}

template <TileMode kMode, ElementFormat kFormat>
__global__ void __launch_bounds__(kTileThreads, 4) quantize_tile_kernel(const TileArgs a) {
  // The bf16 tile for the column pass: chunk k (columns 8k .. 8k+7) of tile row r is stored at sx[r][k ^ (r / 16)].
  // A column read touches rows 16 j + i for the 8 lanes j = 0..7 of a column at once: the XOR sends them to 8
  // different 16-byte bank groups (without it all 8 rows sit in the same banks).
  __shared__ uint4 sx[kTile][kTileChunks];
  __shared__ unsigned warp_amax[kTileWarps];
  constexpr float kMax = kFormat == ElementFormat::E4M3 ? 448.0f : 57344.0f;

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int rt = blockIdx.x / a.col_tiles, ct = blockIdx.x % a.col_tiles;
  const int r0 = rt * kTile, c0 = ct * kTile;
  const int tile_rows = min(kTile, a.rows - r0), tile_cols = min(kTile, a.cols - c0);
  float tensor_scale = 1.0f;
  if (kMode == TileMode::Tensor) {
    // With amax_in every block derives the scale itself (fp8_scale_from_amax's formula). Block 0 overwrites a.scale
    // while later blocks may still read it as the fallback: the fallback is only used when amax_in is 0 or not
    // finite, and then block 0 writes back the value it read, so every block gets the same scale in any order.
    tensor_scale = a.amax_in ? scale_from_amax(a.amax_in[0], a.scale[0], kMax, a.margin_factor, a.pow2) : a.scale[0];
    if (a.amax_in && blockIdx.x == 0 && threadIdx.x == 0) {
      a.scale_out[0] = tensor_scale;
      a.scale_inv_out[0] = div_rn(1.0f, tensor_scale);
    }
  }

  // 1. Load: chunk k of rows r = row0 + 16 s (zeros outside the tensor: they never raise an amax).
  const int k = threadIdx.x % kTileChunks;
  const int row0 = threadIdx.x / kTileChunks;
  const bool chunk_in = 8 * k < tile_cols;  // tile_cols is a multiple of 16
  uint4 v[kTileSteps];  // raw bf16 pairs (see bf16_lo)
#pragma unroll
  for (int s = 0; s < kTileSteps; s++) {
    const int r = row0 + kTileRowsPerStep * s;
    v[s] = make_uint4(0u, 0u, 0u, 0u);
    if (chunk_in && r < tile_rows)
      v[s] = __ldcs(reinterpret_cast<const uint4*>(a.x + static_cast<size_t>(r0 + r) * a.cols + c0 + 8 * k));
  }

  // 2. amaxes. 1x128: each tile row is a block; the 16 lanes holding row r combine their chunks with shuffles. The
  //    other modes only need the tile's amax (128x128 scale, or the tensor's amax), a per-thread max here.
  unsigned row_amax[kTileSteps];
  unsigned thread_amax = 0;
#pragma unroll
  for (int s = 0; s < kTileSteps; s++) {
    unsigned m = amax_bits8(v[s]);
    if (kMode == TileMode::Block1x128) {
#pragma unroll
      for (int offset = kTileChunks / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
    }
    row_amax[s] = m;  // used by 1x128 only
    thread_amax = max(thread_amax, m);
  }

  // 3. Stage the tile for the transposed copy (row r = row0 + 16 s has swizzle key r / 16 = s).
  if (a.data_t) {
#pragma unroll
    for (int s = 0; s < kTileSteps; s++) sx[row0 + kTileRowsPerStep * s][k ^ s] = v[s];
  }

  // 4. Per-tensor and 1x128 row-major codes need nothing from the other threads: write them now, so the loaded
  //    values die before the barrier (fewer live registers). 128x128 waits for the tile amax.
  if (kMode != TileMode::Block128x128 && a.data)
    store_row_codes<kMode, kFormat>(a, v, row_amax, tensor_scale, r0, c0, ct, row0, k, tile_rows, chunk_in);

  // 5. The tile's amax (every thread), reported to the tensor's amax; the 128x128 scale.
  thread_amax = warp_max_bits(thread_amax);
  if (lane == 0) warp_amax[warp] = thread_amax;
  __syncthreads();  // also publishes sx
  unsigned tile_amax = 0;
#pragma unroll
  for (int w = 0; w < kTileWarps; w++) tile_amax = max(tile_amax, warp_amax[w]);
  if (a.amax && threadIdx.x == 0) atomic_max_amax(a.amax, tile_amax);

  float tile_scale = tensor_scale;
  if (kMode == TileMode::Block128x128) {
    tile_scale = block_scale(bits_to_float(tile_amax), kMax, a.pow2);
    if (threadIdx.x == 0) {
      const float inv = div_rn(1.0f, tile_scale);
      if (a.data) {
        float* row = a.scale_inv + static_cast<size_t>(rt) * a.ld;
        row[ct] = inv;
        if (ct == a.col_tiles - 1)
          for (int j = a.col_tiles; j < a.ld; j++) row[j] = 1.0f;  // padding of the last column tile's row
      }
      if (a.data_t) {
        float* row = a.scale_inv_t + static_cast<size_t>(ct) * a.ld_t;
        row[rt] = inv;
        if (rt == a.row_tiles - 1)
          for (int j = a.row_tiles; j < a.ld_t; j++) row[j] = 1.0f;
      }
    }
  }

  if (kMode == TileMode::Block128x128 && a.data)
    store_row_codes<kMode, kFormat>(a, v, row_amax, tile_scale, r0, c0, ct, row0, k, tile_rows, chunk_in);

  // 6. Transposed codes from the staged tile: lane j = lane % 8 converts rows 16 j .. 16 j + 15 of column c.
  if (a.data_t) {
    const int j = lane % kColLanes;
#pragma unroll 1
    for (int p = 0; p < kColPasses; p++) {
      const int c = (p * kTileWarps + warp) * kColsPerWarp + lane / kColLanes;
      float f[16];
      unsigned m = 0;
#pragma unroll
      for (int i = 0; i < 16; i++) {
        const uint16_t* chunk = reinterpret_cast<const uint16_t*>(&sx[16 * j + i][(c / 8) ^ j]);
        f[i] = __uint_as_float(static_cast<uint32_t>(chunk[c % 8]) << 16);
        m = max(m, amax_bits(fabsf(f[i])));
      }
      float sc = tile_scale;
      if (kMode == TileMode::Block1x128) {  // the 128 x 1 block: the 8 lanes of column c
#pragma unroll
        for (int offset = kColLanes / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
        sc = block_scale(bits_to_float(m), kMax, a.pow2);
      }
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; q++)
        w[q] = cvt4<kFormat>(mul_rn(f[4 * q], sc), mul_rn(f[4 * q + 1], sc), mul_rn(f[4 * q + 2], sc),
                             mul_rn(f[4 * q + 3], sc));
      if (c < tile_cols) {
        uint8_t* out = a.data_t + static_cast<size_t>(c0 + c) * a.rows + r0 + 16 * j;
        if (a.vec_t) {
          if (16 * j < tile_rows) *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
#pragma unroll
          for (int i = 0; i < 16; i++)
            if (16 * j + i < tile_rows) out[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
        }
        if (kMode == TileMode::Block1x128 && j == 0)
          a.scale_inv_t[static_cast<size_t>(rt) * a.ld_t + c0 + c] = div_rn(1.0f, sc);
      }
    }
  }
}

template <TileMode kMode>
static void launch_tile_kernel(const TileArgs& args, ElementFormat f, cudaStream_t stream) {
  const size_t tiles = static_cast<size_t>(args.row_tiles) * args.col_tiles;
  if (tiles > 0x7fffffffu) throw_error("fp8 quantize: %zu tiles of 128 x 128 exceed the grid limit", tiles);
  if (tiles == 0) return;
  if (f == ElementFormat::E4M3)
    quantize_tile_kernel<kMode, ElementFormat::E4M3><<<static_cast<unsigned>(tiles), kTileThreads, 0, stream>>>(args);
  else
    quantize_tile_kernel<kMode, ElementFormat::E5M2><<<static_cast<unsigned>(tiles), kTileThreads, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}

// The checks every cast shares: shape, alignment, an FP8 encoding of either family.
static void check_cast(const char* kernel, const QTensor& q, const bf16* x) {
  if (q.rows < 0) throw_error("%s: q.rows = %d must be >= 0", kernel, q.rows);
  if (q.cols <= 0 || q.cols % 16 != 0)
    throw_error("%s: q.cols = %d must be a positive multiple of 16 (FP8 GEMM operands need 16-byte rows; pad the "
                "dimension)",
                kernel, q.cols);
  if (!fp8_tensorwise_encoding(q.encoding) && !fp8_blockwise_encoding(q.encoding))
    throw_error("%s: q.encoding is %s; the FP8 kernels take %s, or %s", kernel, encoding_name(q.encoding).c_str(),
                kTensorwiseDoc, kBlockwiseDoc);
  if (q.rows > 0 && !x) throw_error("%s: x is null", kernel);
  if (x) require_aligned16(kernel, "x", x);
  if (q.data) require_aligned16(kernel, "q.data", q.data);
  if (q.data_t) require_aligned16(kernel, "q.data_t", q.data_t);
}

static TileArgs tile_args(const QTensor& q, const bf16* x) {
  TileArgs a{};
  a.x = x;
  a.data = q.data;
  a.data_t = q.data_t;
  a.rows = q.rows;
  a.cols = q.cols;
  a.row_tiles = static_cast<int>(ceil_div(static_cast<size_t>(q.rows), kTile));
  a.col_tiles = static_cast<int>(ceil_div(static_cast<size_t>(q.cols), kTile));
  a.vec_t = q.rows % 16 == 0;
  return a;
}

void fp8_quantize_tensorwise(const QTensor& q, const bf16* x, float* amax_out, cudaStream_t stream) {
  const char* kernel = "fp8_quantize_tensorwise";
  check_cast(kernel, q, x);
  if (!fp8_tensorwise_encoding(q.encoding))
    throw_error("%s: q.encoding is %s; per-tensor casts take %s (block encodings: fp8_quantize_blockwise)", kernel,
                encoding_name(q.encoding).c_str(), kTensorwiseDoc);
  if (!q.scale) throw_error("%s: q.scale is null (the per-tensor multiplier, on the device)", kernel);
  TileArgs a = tile_args(q, x);
  a.scale = q.scale;
  a.amax = amax_out;
  if (q.rows == 0 || (!q.data && !q.data_t && !amax_out)) return;
  launch_tile_kernel<TileMode::Tensor>(a, q.encoding.element, stream);
}

void fp8_quantize_tensorwise_from_amax(const QTensor& q, const bf16* x, const float* amax, int margin,
                                       cudaStream_t stream) {
  const char* kernel = "fp8_quantize_tensorwise_from_amax";
  check_cast(kernel, q, x);
  if (!fp8_tensorwise_encoding(q.encoding))
    throw_error("%s: q.encoding is %s; per-tensor casts take %s", kernel, encoding_name(q.encoding).c_str(),
                kTensorwiseDoc);
  if (!q.scale || !q.scale_inv || !amax)
    throw_error("%s: q.scale (%p), q.scale_inv (%p) and amax (%p) must all be device pointers", kernel,
                static_cast<void*>(q.scale), static_cast<void*>(q.scale_inv), static_cast<const void*>(amax));
  TileArgs a = tile_args(q, x);
  a.scale = q.scale;
  a.amax_in = amax;
  a.scale_out = q.scale;
  a.scale_inv_out = q.scale_inv;
  a.margin_factor = margin_factor(kernel, margin);
  a.pow2 = q.encoding.pow2_scales();
  if (q.rows == 0 || (!q.data && !q.data_t)) {  // nothing to cast: the scale alone
    fp8_scale_from_amax(q.scale, q.scale_inv, amax, q.encoding, margin, stream);
    return;
  }
  launch_tile_kernel<TileMode::Tensor>(a, q.encoding.element, stream);
}

void fp8_quantize_blockwise(const QTensor& q, const bf16* x, cudaStream_t stream) {
  const char* kernel = "fp8_quantize_blockwise";
  check_cast(kernel, q, x);
  if (!fp8_blockwise_encoding(q.encoding))
    throw_error("%s: q.encoding is %s; block casts take %s (whole-tensor encodings: fp8_quantize_tensorwise)", kernel,
                encoding_name(q.encoding).c_str(), kBlockwiseDoc);
  if (q.data && !q.scale_inv) throw_error("%s: q.data is set but q.scale_inv is null", kernel);
  if (q.data_t && !q.scale_inv_t) throw_error("%s: q.data_t is set but q.scale_inv_t is null", kernel);
  TileArgs a = tile_args(q, x);
  a.scale_inv = q.scale_inv;
  a.scale_inv_t = q.scale_inv_t;
  a.ld = scale_inv_ld(q.encoding, q.rows, q.cols);
  a.ld_t = scale_inv_ld(q.encoding, q.cols, q.rows);
  a.pow2 = q.encoding.pow2_scales();
  a.amax = q.amax;
  // q.amax is overwritten: zeroed here, then every tile's amax is atomically maxed into it (stream-ordered).
  if (q.amax) CUDA_CHECK(cudaMemsetAsync(q.amax, 0, sizeof(float), stream));
  if (q.rows == 0) return;
  if (q.encoding.block == kBlock1x128)
    launch_tile_kernel<TileMode::Block1x128>(a, q.encoding.element, stream);
  else
    launch_tile_kernel<TileMode::Block128x128>(a, q.encoding.element, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// Dequantisation: one element per thread (tests and telemetry only).
template <ElementFormat F>
__device__ inline float fp8_to_float(uint8_t code) {
  constexpr __nv_fp8_interpretation_t kind = F == ElementFormat::E4M3 ? __NV_E4M3 : __NV_E5M2;
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, kind)));  // exact: every FP8 value is an FP16 value
}

template <ElementFormat F>
__global__ void fp8_dequantize_kernel(float* out, const uint8_t* data, const float* scale_inv, int rows, int cols,
                                      BlockShape block, int ld) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * cols) return;
  const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
  out[i] = mul_rn(fp8_to_float<F>(data[i]), scale_inv[scale_index(block, r, c, ld)]);
}

// ---------------------------------------------------------------------------------------------------------------
// Transpose of codes. One block per 64 x 64 tile: 256 threads load it as 16-byte chunks of rows into shared memory
// and write it out as 16-byte chunks of columns. rows % 16 == 0 keeps every 16-row chunk of an output row either
// wholly inside the tensor or wholly outside it.
constexpr int kTransposeTile = 64;
constexpr int kTransposeThreads = 256;

__global__ void __launch_bounds__(kTransposeThreads) fp8_transpose_codes_kernel(uint8_t* dst, const uint8_t* src,
                                                                                int rows, int cols, int col_tiles) {
  __shared__ __align__(16) uint8_t tile[kTransposeTile][kTransposeTile];
  const int r0 = (blockIdx.x / col_tiles) * kTransposeTile, c0 = (blockIdx.x % col_tiles) * kTransposeTile;
  // load: 64 rows x 4 chunks of 16 bytes, one chunk per thread
  {
    const int r = threadIdx.x / 4, k = threadIdx.x % 4;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < rows && c0 + 16 * k < cols)
      v = *reinterpret_cast<const uint4*>(src + static_cast<size_t>(r0 + r) * cols + c0 + 16 * k);
    *reinterpret_cast<uint4*>(&tile[r][16 * k]) = v;
  }
  __syncthreads();
  // store: output row c (64 of them) holds source rows r0 .. r0+63 of column c0 + c, 64 bytes; each thread writes
  // 16 of them (source rows 16 q .. 16 q + 15) as one 16-byte store. A warp covers 32 columns of the same rows, so
  // its shared-memory reads hit 8 distinct words (broadcast within each), no bank conflicts.
  const int c = threadIdx.x % kTransposeTile, q = threadIdx.x / kTransposeTile;
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int r = 16 * q + 4 * i;
    w[i] = static_cast<uint32_t>(tile[r][c]) | (static_cast<uint32_t>(tile[r + 1][c]) << 8) |
           (static_cast<uint32_t>(tile[r + 2][c]) << 16) | (static_cast<uint32_t>(tile[r + 3][c]) << 24);
  }
  if (c0 + c < cols && r0 + 16 * q < rows)
    *reinterpret_cast<uint4*>(dst + static_cast<size_t>(c0 + c) * rows + r0 + 16 * q) =
        make_uint4(w[0], w[1], w[2], w[3]);
}

void fp8_transpose_codes(uint8_t* dst, const uint8_t* src, int rows, int cols, cudaStream_t stream) {
  const char* kernel = "fp8_transpose_codes";
  if (rows <= 0 || cols <= 0 || rows % 16 != 0 || cols % 16 != 0)
    throw_error("%s: rows = %d and cols = %d must be positive multiples of 16", kernel, rows, cols);
  if (!dst || !src) throw_error("%s: dst and src must be device pointers", kernel);
  require_aligned16(kernel, "src", src);
  require_aligned16(kernel, "dst", dst);
  const int row_tiles = static_cast<int>(ceil_div(static_cast<size_t>(rows), kTransposeTile));
  const int col_tiles = static_cast<int>(ceil_div(static_cast<size_t>(cols), kTransposeTile));
  const size_t tiles = static_cast<size_t>(row_tiles) * col_tiles;
  if (tiles > 0x7fffffffu) throw_error("%s: %zu tiles exceed the grid limit", kernel, tiles);
  fp8_transpose_codes_kernel<<<static_cast<unsigned>(tiles), kTransposeThreads, 0, stream>>>(dst, src, rows, cols,
                                                                                            col_tiles);
  CUDA_CHECK_LAUNCH();
}

void fp8_dequantize(float* out, const QTensor& q, bool transposed, cudaStream_t stream) {
  const char* kernel = "fp8_dequantize";
  const uint8_t* data = transposed ? q.data_t : q.data;
  const bool own_scales_t = transposed && !q.encoding.per_tensor();  // a whole-tensor data_t shares scale_inv
  const float* scale_inv = own_scales_t ? q.scale_inv_t : q.scale_inv;
  const int rows = transposed ? q.cols : q.rows, cols = transposed ? q.rows : q.cols;
  if (rows < 0 || cols < 0) throw_error("%s: q.rows = %d, q.cols = %d must be >= 0", kernel, q.rows, q.cols);
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  if (!out) throw_error("%s: out is null", kernel);
  if (!data) throw_error("%s: q.%s is null", kernel, transposed ? "data_t" : "data");
  if (!scale_inv) throw_error("%s: q.%s is null", kernel, own_scales_t ? "scale_inv_t" : "scale_inv");
  if (!fp8_tensorwise_encoding(q.encoding) && !fp8_blockwise_encoding(q.encoding))
    throw_error("%s: q.encoding is %s; the FP8 kernels take %s, or %s", kernel, encoding_name(q.encoding).c_str(),
                kTensorwiseDoc, kBlockwiseDoc);
  const int ld = scale_inv_ld(q.encoding, rows, cols);
  const BlockShape block = q.encoding.block;
  const unsigned blocks = static_cast<unsigned>(ceil_div(n, 256));
  if (q.encoding.element == ElementFormat::E4M3)
    fp8_dequantize_kernel<ElementFormat::E4M3><<<blocks, 256, 0, stream>>>(out, data, scale_inv, rows, cols, block, ld);
  else
    fp8_dequantize_kernel<ElementFormat::E5M2><<<blocks, 256, 0, stream>>>(out, data, scale_inv, rows, cols, block, ld);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------------------
// Telemetry. Stage 1: a fixed grid (kStatsBlocks x kStatsThreads, whatever the GPU) strides over 8-element groups in a
// fixed pattern; each block reduces its threads' sums in a fixed order (block_sum) into kQuantStatsSlots doubles of a
// partials array (counts are exact integers in a double). Stage 2: one block combines the kStatsBlocks partials in a
// fixed order. The partials live in stream-ordered scratch (cudaMallocAsync / cudaFreeAsync on the caller's stream).
constexpr int kStatsBlocks = kQuantStatsBlocks;
constexpr int kStatsThreads = 256;

// Slots: llmc/precision/quantize.h's QuantStatsSlot. In the partials, kStatAmax holds the amax bits and kStatScale
// the max scale_inv bits (as exact doubles).
struct StatsArgs {
  const bf16* x;
  const uint8_t* data;
  const float* scale_inv;
  const float* scale;          // per tensor: (1) the multiplier the cast used; blocks: null (fp8_block_multiplier)
  int rows, cols, ld;
  int scale_rows, scale_cols;  // the valid (non-padding) part of scale_inv: entries [i * ld + j], i < scale_rows, j < scale_cols
  BlockShape block;
  bool pow2;                   // power-of-two block scales
};

// The max of two bit patterns (amax_bits) over a block of kThreads threads, exact and order independent; the results
// are valid in thread 0.
template <int kThreads>
__device__ inline void block_max_bits_in_thread0(unsigned& a, unsigned& b) {
  __shared__ unsigned warp_max_s[2][kThreads / kWarpSize];
  a = warp_max_bits(a);
  b = warp_max_bits(b);
  if (threadIdx.x % kWarpSize == 0) {
    warp_max_s[0][threadIdx.x / kWarpSize] = a;
    warp_max_s[1][threadIdx.x / kWarpSize] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / kWarpSize; w++) {
      a = max(a, warp_max_s[0][w]);
      b = max(b, warp_max_s[1][w]);
    }
}

template <ElementFormat F>
__global__ void __launch_bounds__(kStatsThreads) fp8_quant_stats_kernel(double* partials, const StatsArgs a) {
  constexpr uint8_t kMaxCode = F == ElementFormat::E4M3 ? 0x7E : 0x7B;
  const float fp8max = fp8_max_of(F);
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t groups = static_cast<size_t>(a.rows) * a.cols / 8;  // cols % 16 == 0: a group never leaves its row
  double sum_x2 = 0.0, sum_err2 = 0.0;
  unsigned saturated = 0, underflow = 0, nonzero = 0, clipped = 0, amax = 0;
  const float tensor_scale = a.scale ? a.scale[0] : 0.0f;
  for (size_t gi = thread; gi < groups; gi += stride) {
    const size_t i = 8 * gi;
    const int r = static_cast<int>(i / a.cols), c = static_cast<int>(i % a.cols);
    const x128 xv = load128(a.x + i);
    const uint2 codes = *reinterpret_cast<const uint2*>(a.data + i);
    const float si = a.scale_inv[scale_index(a.block, r, c, a.ld)];
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const uint8_t code = static_cast<uint8_t>((e < 4 ? codes.x : codes.y) >> (8 * (e % 4)));
      const float xf = __bfloat162float(xv[e]);
      const float deq = mul_rn(fp8_to_float<F>(code), si);
      const double err = static_cast<double>(xf) - static_cast<double>(deq);
      sum_x2 += static_cast<double>(xf) * xf;
      sum_err2 += err * err;
      nonzero += xf != 0.0f;
      underflow += xf != 0.0f && (code & 0x7f) == 0;
      saturated += (code & 0x7f) == kMaxCode;
      clipped += fp8_clipped(xf, a.scale ? tensor_scale : fp8_block_multiplier(xf, si, fp8max, a.pow2), fp8max);
      amax = max(amax, amax_bits(fabsf(xf)));
    }
  }
  unsigned max_si = 0;  // the largest scale_inv of a real (non-padding) block: the smallest scale
  const size_t entries = static_cast<size_t>(a.scale_rows) * a.scale_cols;
  for (size_t e = thread; e < entries; e += stride) {
    const size_t idx = (e / a.scale_cols) * a.ld + e % a.scale_cols;
    max_si = max(max_si, amax_bits(fabsf(a.scale_inv[idx])));
  }
  const double s_x2 = block_sum(sum_x2);
  const double s_err2 = block_sum(sum_err2);
  const double s_sat = block_sum(static_cast<double>(saturated));
  const double s_under = block_sum(static_cast<double>(underflow));
  const double s_nonzero = block_sum(static_cast<double>(nonzero));
  const double s_clipped = block_sum(static_cast<double>(clipped));
  block_max_bits_in_thread0<kStatsThreads>(amax, max_si);
  if (threadIdx.x == 0) {
    double* p = partials + static_cast<size_t>(blockIdx.x) * kQuantStatsSlots;
    p[kStatAmax] = amax;
    p[kStatScale] = max_si;
    p[kStatSaturated] = s_sat;
    p[kStatUnderflow] = s_under;
    p[kStatNonzero] = s_nonzero;
    p[kStatSumX2] = s_x2;
    p[kStatSumErr2] = s_err2;
    p[kStatElements] = 0.0;
    p[kStatClipped] = s_clipped;
  }
}

__global__ void __launch_bounds__(kStatsBlocks) combine_quant_stats_kernel(double* out, const double* partials,
                                                                           double elements) {
  const double* p = partials + static_cast<size_t>(threadIdx.x) * kQuantStatsSlots;  // one block's partials
  unsigned amax = static_cast<unsigned>(p[kStatAmax]), max_si = static_cast<unsigned>(p[kStatScale]);
  double sums[kQuantStatsSlots];
#pragma unroll
  for (int k = 0; k < kQuantStatsSlots; k++) sums[k] = quant_stats_sum_slot(k) ? block_sum(p[k]) : 0.0;
  block_max_bits_in_thread0<kStatsBlocks>(amax, max_si);
  if (threadIdx.x == 0) {
    for (int k = 0; k < kQuantStatsSlots; k++) out[k] = sums[k];
    out[kStatAmax] = bits_to_float(amax);
    out[kStatScale] = 1.0 / static_cast<double>(bits_to_float(max_si));
    out[kStatElements] = elements;
  }
}

void fp8_quant_stats(double* stats_out, const QTensor& q, const bf16* x, cudaStream_t stream) {
  const char* kernel = "fp8_quant_stats";
  check_cast(kernel, q, x);
  if (!stats_out) throw_error("%s: stats_out is null", kernel);
  if (!q.data) throw_error("%s: q.data is null (the stats read the row-major codes)", kernel);
  if (!q.scale_inv) throw_error("%s: q.scale_inv is null", kernel);
  const bool per_tensor = fp8_tensorwise_encoding(q.encoding);
  if (per_tensor && !q.scale)
    throw_error("%s: q.scale is null (a per-tensor cast's multiplier: the clipped count scales x by it)", kernel);
  StatsArgs a{x,      q.data,  q.scale_inv, per_tensor ? q.scale : nullptr, q.rows, q.cols,
              scale_inv_ld(q.encoding, q.rows, q.cols), 0, 0, q.encoding.block, q.encoding.pow2_scales()};
  valid_scale_shape(q.encoding, q.rows, q.cols, &a.scale_rows, &a.scale_cols);
  double* partials = nullptr;
  CUDA_CHECK(cudaMallocAsync(&partials, sizeof(double) * kStatsBlocks * kQuantStatsSlots, stream));
  if (q.encoding.element == ElementFormat::E4M3)
    fp8_quant_stats_kernel<ElementFormat::E4M3><<<kStatsBlocks, kStatsThreads, 0, stream>>>(partials, a);
  else
    fp8_quant_stats_kernel<ElementFormat::E5M2><<<kStatsBlocks, kStatsThreads, 0, stream>>>(partials, a);
  CUDA_CHECK_LAUNCH();
  combine_quant_stats(stats_out, partials, static_cast<double>(q.rows) * q.cols, stream);
  CUDA_CHECK(cudaFreeAsync(partials, stream));
}

void combine_quant_stats(double* stats_out, const double* partials, double elements, cudaStream_t stream) {
  combine_quant_stats_kernel<<<1, kStatsBlocks, 0, stream>>>(stats_out, partials, elements);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
