// llmc/precision/fp4_quant.cu: the FP4 quantisation kernels of llmc/precision/fp4_quant.h, bit-exact with their host
// references (test/reference/fp4_ref.cpp): the same codes, block scales and tensor scales. The arithmetic is
// llmc/precision/fp4_codec.cuh's, fp4_rng.cuh's and hadamard.cuh's, shared with the references; everything
// is a pure function of the element's block, so nothing depends on the launch shape.
//
// Kernels:
//   fp4_run_kernel<N>: one thread per 1xN block of one output copy, a CTA per tile of 64 source rows x 4N source
//     columns: the tile is loaded into shared memory in whole rows (8 bf16 at a time where rows are 16-byte aligned;
//     fp4_requantize: 8 MXFP4 codes at a time, decoded to their exact BF16 values),
//     then each thread reads its block along a tile row (data) or a tile column (data_t), applies the Hadamard
//     transform if asked, takes the block amax (max over the bits of |v|: order independent, a NaN wins), computes the
//     scale code and the element multiplier, rounds, packs two codes per byte and stores them (one 8- or 16-byte
//     store for a full block when the row's bytes allow, else bytes); the threads of a tile write whole runs of code
//     bytes and scale bytes (and, for an NVFP4 copy asked for as values, its 16 decoded BF16 values: two 16-byte
//     stores). In amax mode (the NVFP4 tensor amax of a rotated copy) it only maxes the block amaxes
//     into a slot, and the source's own amax into another when asked (one read for both), one atomic per CTA each.
//   rotated_column_amax_kernel: the same amax pass for an NVFP4 data_t copy rotated by Hadamard-16 (even cols),
//     without the tiles: a thread per 16 rows x 2 columns, read straight from x in 128-byte warp rows (the source
//     amax in the same read).
//   mxfp4_gradient_epilogue_kernel<E>: Quartet's backward output, 32 / E lanes per 32-element run (E elements each):
//     scale, mask, inverse Hadamard (in registers, then by shuffles), the forward's signs, store (bf16) or accumulate
//     (FP32).
//   fp4_tile_kernel: 16x16 tiles (NVFP4 weights), 16 lanes of a warp per tile: lane j loads row j of the tile, the
//     tile amax is a max over the 16 lanes (shuffles), lane j rounds row j into data, and the 16 lanes transpose the
//     tile's codes by shuffles (column j has the same values, the same scale and the same draws: the same codes) into
//     row j of the tile in data_t.
// The scale arrays are first filled with the code of 1.0 (cudaMemsetAsync), so padding entries need no thread.
#include <algorithm>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/core/float_rn.cuh"
#include "llmc/precision/fp4_codec.cuh"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/fp4_remap.cuh"
#include "llmc/precision/fp4_rng.cuh"
#include "llmc/precision/fp8_quant.h"
#include "llmc/precision/hadamard.cuh"
#include "llmc/precision/scale_math.cuh"

#if defined(__CUDACC__) && defined(__USE_FAST_MATH__)
#error "llmc/precision/fp4_quant.cu must be compiled without --use_fast_math: host and device must agree bit for bit"
#endif

namespace llmc {

bool nvfp4_encoding(const Encoding& e) { return e == kNvfp4Encoding || e == kNvfp4WeightEncoding; }
bool mxfp4_encoding(const Encoding& e) { return e == kMxfp4Encoding; }

static const char* const kFp4Doc =
    "e2m1 1x16 | 16x16 e4m3 scales + fp32 tensor scale (NVFP4), e2m1 1x32 e8m0 scales (MXFP4)";

namespace {

constexpr int kThreads = 256;

struct RunArgs {
  const bf16* x;            // the source, or null when it is the MXFP4 codes below
  const uint8_t* src_codes;   // or: an MXFP4 tensor's row-wise codes (rows, cols), decoded as the tiles load
  const uint8_t* src_scales;  //   their E8M0 scales [c / 32 * src_ld + r]
  int src_ld;
  int rows, cols;           // the source
  bool column;              // false: data (blocks along cols); true: data_t (blocks along rows)
  bool vector_loads;        // x's rows are 16-byte aligned (cols % 8 == 0, x aligned): tiles load 8 bf16 at a time;
                            // with src_codes: cols % 8 == 0 and the codes 4-byte aligned (8 codes in one load)
  uint8_t* codes;           // (out_rows, out_cols) packed, or null (amax mode, or values only)
  bf16* values;             // NVFP4 1x16: (out_rows, out_cols) decoded values without the tensor scale, or null
  uint8_t* scales;          // [kb * ld + o]
  int out_rows, out_cols, ld, blocks_per_row;
  bool nvfp4;
  const float* tensor_amax;   // NVFP4: the amax of this copy's (rotated) values
  float* tensor_scale_inv;    // NVFP4: where thread 0 writes 1 / s_enc, or null
  bool stochastic;
  StochasticKey key;
  int copy;
  int hadamard;               // 0, 16 or 32
  uint32_t signs;
  float* amax_out;            // amax mode: the block amaxes are maxed into it (nothing else is written)
  float* source_amax_out;     // amax mode: also max |x| of the unrotated source into it, or null
  Mxfp4Scale mxfp4_scale;     // MXFP4: the amax rule, QuEST's Gaussian scales or Quartet's range-matched ones
  uint32_t* trust_mask;       // MXFP4 data copy: the block's trust bits [o * blocks_per_row + kb], or null
};

// fp4_run_kernel's tiles: kRunTileRows source rows x 4N source columns, staged in shared memory (bf16) so that both
// copies read x in whole rows and write their codes in runs of N / 2 * 4 bytes; each smem row is padded by 8 bf16
// (16-byte aligned rows that start 4 banks apart). A tile holds 256 blocks of either copy: 4 per row for data
// (threads 4 lo + j), 4 (N = 16) or 2 (N = 32) per column for data_t (threads lo + 4N j: a warp reads one smem row).
constexpr int kRunTileRows = 64;
constexpr int kRunTilePad = 8;
template <int N>
constexpr int run_tile_cols() {
  return 4 * N;
}
template <int N>
size_t run_tiles(int rows, int cols) {
  return ceil_div(static_cast<size_t>(rows), kRunTileRows) * ceil_div(static_cast<size_t>(cols), run_tile_cols<N>());
}
__device__ inline float load_x(const bf16* x, size_t i) { return __bfloat162float(x[i]); }
// The value of an FP4 code with block scale code s (NVFP4: times the tensor scale_inv tsi), fp4_codec.cuh's formula.
__device__ inline float dequantized_value(uint8_t code, uint8_t s, float tsi, bool nvfp4) {
  return nvfp4 ? mul_rn(mul_rn(e2m1_value(code), e4m3_value(s)), tsi) : mul_rn(e2m1_value(code), e8m0_value(s));
}

// Elements c .. c + 7 of row r of an MXFP4 source (c % 8 == 0: one scale), as BF16 (exact: fp4_dequantize's
// values); zeros at and past cols.
__device__ inline x128 load_mxfp4_chunk(const RunArgs& a, int r, int c) {
  x128 v = x128::filled(0.0f);
  const uint8_t* row = a.src_codes + static_cast<size_t>(r) * ((static_cast<size_t>(a.cols) + 1) / 2);
  const uint8_t s = a.src_scales[scale_index(kBlock1x32, r, c, a.src_ld)];
  if (a.vector_loads) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(row + c / 2);
#pragma unroll
    for (int k = 0; k < 8; k++)
      v[k] = __float2bfloat16_rn(dequantized_value(static_cast<uint8_t>((word >> (4 * k)) & 0xFu), s, 1.0f, false));
  } else {
    for (int k = 0; k < 8 && c + k < a.cols; k++)
      v[k] = __float2bfloat16_rn(dequantized_value(e2m1_nibble(row[(c + k) / 2], c + k), s, 1.0f, false));
  }
  return v;
}

// The scale code and element multiplier of a block with amax bits `amax_bits`.
__device__ inline void block_scale(bool nvfp4, float s_enc, unsigned amax_bits, uint8_t* code, float* multiplier) {
  const float a = __uint_as_float(amax_bits);
  if (nvfp4) {
    *code = nvfp4_block_scale_code(a, s_enc);
    *multiplier = nvfp4_element_multiplier(*code, s_enc);
  } else {
    *code = mxfp4_scale_code(a);
    *multiplier = mxfp4_element_multiplier(*code);
  }
}

// The E2M1 code of v * multiplier (a nonzero multiplier), rounded to nearest or stochastically with the element's
// 16 random bits r (fp4_rng.cuh's random_bits16).
template <bool kStochastic>
__device__ inline uint8_t e2m1_scaled(float v, float multiplier, uint32_t r) {
  const float y = mul_rn(v, multiplier);
  return kStochastic ? e2m1_sr(y, r) : e2m1_rn(y);
}

// Round v * multiplier (0 multiplier: code 0) for element `index` of copy `copy`, any element order: one Philox call
// per group of eight consecutive indices.
struct Rounder {
  bool stochastic;
  StochasticKey key;
  int copy;
  uint64_t group = ~0ull;
  Philox4 words{};
  __device__ uint8_t operator()(float v, float multiplier, uint64_t index) {
    if (multiplier == 0.0f) return 0;
    if (!stochastic) return e2m1_scaled<false>(v, multiplier, 0);
    if ((index >> 3) != group) {
      group = index >> 3;
      words = random_words8(key, index, copy);
    }
    return e2m1_scaled<true>(v, multiplier, random_half(words, static_cast<int>(index & 7)));
  }
};

// A whole 1xN block as packed codes, without the Rounder's per-element checks: rounded to nearest, or stochastically
// when index0 (the block's first element index) is a multiple of 8, so that each group of eight elements takes one
// Philox call at indices known here (random_half with constant k).
template <int N, bool kStochastic>
__device__ inline void e2m1_block(const float (&v)[N], float multiplier, uint32_t (&packed)[N / 8],
                                  const StochasticKey& key, uint64_t index0, int copy) {
#pragma unroll
  for (int w = 0; w < N / 8; w++) packed[w] = 0;
  if (multiplier == 0.0f) return;
#pragma unroll
  for (int w = 0; w < N / 8; w++) {
    Philox4 words{};
    if constexpr (kStochastic) words = random_words8(key, index0 + 8 * w, copy);
#pragma unroll
    for (int k = 0; k < 8; k++)
      packed[w] |= static_cast<uint32_t>(e2m1_scaled<kStochastic>(v[8 * w + k], multiplier,
                                                                  kStochastic ? random_half(words, k) : 0u))
                   << (4 * k);
  }
}

// The packed codes of a 1xN block of n <= N values (zeros past n: code 0), element i with index index0 + i: whole
// blocks through e2m1_block (stochastic ones when index0 is a multiple of 8), any other block element by element.
template <int N>
__device__ inline void block_codes(const float (&v)[N], int n, float multiplier, bool stochastic,
                                   const StochasticKey& key, uint64_t index0, int copy, uint32_t (&packed)[N / 8]) {
  if (n == N && !stochastic) {
    e2m1_block<N, false>(v, multiplier, packed, key, index0, copy);
  } else if (n == N && index0 % 8 == 0) {
    e2m1_block<N, true>(v, multiplier, packed, key, index0, copy);
  } else {
    Rounder round{stochastic, key, copy};
#pragma unroll
    for (int w = 0; w < N / 8; w++) {
      uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const int i = 8 * w + k;
        if (i < n) word |= static_cast<uint32_t>(round(v[i], multiplier, index0 + i)) << (4 * k);
      }
      packed[w] = word;
    }
  }
}

// Max two amaxes (bits) over the CTA and issue one atomic per slot (slot1 may be null). Every thread of the CTA must
// call it, at most once per kernel (it synchronises the CTA and owns its shared words).
__device__ inline void cta_atomic_max_amax2(float* slot0, unsigned bits0, float* slot1, unsigned bits1) {
  __shared__ unsigned warp_amax[2][kThreads / kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  bits0 = warp_max_bits(bits0);
  bits1 = warp_max_bits(bits1);
  if (lane == 0) warp_amax[0][warp] = bits0, warp_amax[1][warp] = bits1;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / kWarpSize; w++)
      bits0 = max(bits0, warp_amax[0][w]), bits1 = max(bits1, warp_amax[1][w]);
    atomic_max_amax(slot0, bits0);
    if (slot1) atomic_max_amax(slot1, bits1);
  }
}

template <int N>
__global__ void __launch_bounds__(kThreads) fp4_run_kernel(const RunArgs a) {
  constexpr int kCols = run_tile_cols<N>(), kLd = kCols + kRunTilePad;
  static_assert(kRunTileRows * kCols / N == kThreads, "one block of either copy per thread");
  static_assert(kRunTileRows % N == 0, "whole column blocks per tile");
  __shared__ alignas(16) bf16 tile[kRunTileRows * kLd];
  const int col_tiles = (a.cols + kCols - 1) / kCols;
  const int r0 = static_cast<int>(blockIdx.x / col_tiles) * kRunTileRows;
  const int c0 = static_cast<int>(blockIdx.x % col_tiles) * kCols;
  constexpr int kChunksPerRow = kCols / 8;  // 8-element chunks: 2 (N = 16) or 4 (N = 32) per thread
  constexpr int kChunksPerThread = kRunTileRows * kChunksPerRow / kThreads;
  static_assert(kChunksPerThread * kThreads == kRunTileRows * kChunksPerRow, "whole chunks per thread");
  if (a.src_codes) {
#pragma unroll
    for (int k = 0; k < kChunksPerThread; k++) {
      const unsigned t = threadIdx.x + k * kThreads;
      const int lr = static_cast<int>(t / kChunksPerRow), lc = static_cast<int>(t % kChunksPerRow) * 8;
      const int r = r0 + lr, c = c0 + lc;
      store128(tile + lr * kLd + lc, r < a.rows && c < a.cols ? load_mxfp4_chunk(a, r, c) : x128::filled(0.0f));
    }
  } else if (a.vector_loads) {
#pragma unroll
    for (int k = 0; k < kChunksPerThread; k++) {
      const unsigned t = threadIdx.x + k * kThreads;
      const int lr = static_cast<int>(t / kChunksPerRow), lc = static_cast<int>(t % kChunksPerRow) * 8;
      const int r = r0 + lr, c = c0 + lc;  // cols % 8 == 0: a chunk is wholly inside or wholly outside
      uint4 packed = make_uint4(0u, 0u, 0u, 0u);
      if (r < a.rows && c < a.cols) packed = *reinterpret_cast<const uint4*>(a.x + static_cast<size_t>(r) * a.cols + c);
      *reinterpret_cast<uint4*>(tile + lr * kLd + lc) = packed;
    }
  } else {
    for (int t = threadIdx.x; t < kRunTileRows * kCols; t += kThreads) {
      const int lr = t / kCols, lc = t % kCols;
      const int r = r0 + lr, c = c0 + lc;
      tile[lr * kLd + lc] =
          r < a.rows && c < a.cols ? a.x[static_cast<size_t>(r) * a.cols + c] : __float2bfloat16(0.0f);
    }
  }
  __syncthreads();

  int o = 0, kb = 0;  // output row, block within it
  float v[N];         // the block's values; zeros past the source's edges
  if (a.column) {
    const int lo = threadIdx.x % kCols, lkb = threadIdx.x / kCols;
    o = c0 + lo, kb = r0 / N + lkb;
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = __bfloat162float(tile[(lkb * N + i) * kLd + lo]);
  } else {
    const int lo = threadIdx.x / 4, lkb = threadIdx.x % 4;
    o = r0 + lo, kb = c0 / N + lkb;
#pragma unroll
    for (int w = 0; w < N / 8; w++) {
      const x128 packed = load128(tile + lo * kLd + lkb * N + 8 * w);
#pragma unroll
      for (int k = 0; k < 8; k++) v[8 * w + k] = __bfloat162float(packed[k]);
    }
  }
  const int p0 = kb * N;
  const bool active = o < a.out_rows && p0 < a.out_cols;
  const int n = active ? min(N, a.out_cols - p0) : 0;
  unsigned source_amax = 0;
  if (a.source_amax_out) {
#pragma unroll
    for (int i = 0; i < N; i++) source_amax = max(source_amax, __float_as_uint(fabsf(v[i])));
  }
  if (a.hadamard != 0 && n == N) {
#pragma unroll
    for (int g = 0; g < N; g += 16)
      if (g % a.hadamard == 0) hadamard_transform_n(v + g, a.hadamard, a.signs);
  }
  unsigned amax = 0;
#pragma unroll
  for (int i = 0; i < N; i++) amax = max(amax, __float_as_uint(fabsf(v[i])));  // padding zeros add nothing
  if (a.amax_out) {  // one atomic per CTA and slot (a same-address atomic per warp bounded these passes)
    cta_atomic_max_amax2(a.amax_out, amax, a.source_amax_out, source_amax);
    return;
  }
  if (!active) return;
  const float s_enc = a.nvfp4 ? nvfp4_tensor_encode_scale(a.tensor_amax[0]) : 1.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.tensor_scale_inv) a.tensor_scale_inv[0] = div_rn(1.0f, s_enc);
  uint8_t scale_code;
  float multiplier;
  bool gaussian = false;
  if constexpr (N == kGaussianBlock) {
    if (a.mxfp4_scale == Mxfp4Scale::Gaussian) {
      gaussian = true;
      scale_code = mxfp4_gaussian_scale_code(v, amax);
      multiplier = mxfp4_element_multiplier(scale_code);
    }
  }
  if (!gaussian) block_scale(a.nvfp4, s_enc, amax, &scale_code, &multiplier);
  if (a.mxfp4_scale == Mxfp4Scale::RangeMatched) multiplier = mxfp4_range_matched_multiplier(scale_code);
  a.scales[static_cast<size_t>(kb) * a.ld + o] = scale_code;
  if (a.trust_mask) {
    uint32_t trusted = 0;
#pragma unroll
    for (int i = 0; i < N; i++)
      if (i < n && e2m1_trusted(v[i], multiplier)) trusted |= 1u << i;
    a.trust_mask[static_cast<size_t>(o) * a.blocks_per_row + kb] = trusted;
  }

  uint32_t packed[N / 8];  // N / 2 bytes
  block_codes<N>(v, n, multiplier, a.stochastic, a.key, static_cast<uint64_t>(o) * a.out_cols + p0, a.copy, packed);
  if constexpr (N == 16) {
    if (a.values) {  // n == N: the quantised direction is a multiple of 16 (quantize_runs checks)
      const Nvfp4BlockValues table = nvfp4_block_values(scale_code);
      uint32_t v[2][4];
      nvfp4_values_word(table, packed[0], v[0]);
      nvfp4_values_word(table, packed[1], v[1]);
      uint4* out = reinterpret_cast<uint4*>(a.values + static_cast<size_t>(o) * a.out_cols + p0);
      out[0] = make_uint4(v[0][0], v[0][1], v[0][2], v[0][3]);
      out[1] = make_uint4(v[1][0], v[1][1], v[1][2], v[1][3]);
    }
  }
  if (!a.codes) return;
  const size_t row_bytes = (static_cast<size_t>(a.out_cols) + 1) / 2;
  uint8_t* dst = a.codes + static_cast<size_t>(o) * row_bytes + p0 / 2;
  if (n == N && row_bytes % (N / 2) == 0) {
    if constexpr (N == 16)
      *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  } else {
    for (int b = 0; b < (n + 1) / 2; b++) dst[b] = static_cast<uint8_t>(packed[b / 4] >> (8 * (b % 4)));
  }
}

// The amax pass of an NVFP4 copy rotated along the source's rows (data_t with a Hadamard-16 transform: the wgrad
// inputs' RHT), without fp4_run_kernel's shared-memory tiles: one thread per 16-row group of two adjacent columns
// (cols even, x 4-byte aligned), consecutive threads on consecutive column pairs so that a warp reads 128 contiguous
// bytes of each row. Each column's 16 values are rotated by hadamard.cuh's transform, as fp4_run_kernel does for the
// same block, and their |values| maxed on the bits (order independent: the same amax as the tiled pass, NaN wins);
// source_amax_out (or null) also gets max |x|. One atomic per CTA and slot.
constexpr int kRotatedAmaxRows = 16;
__global__ void __launch_bounds__(kThreads) rotated_column_amax_kernel(const bf16* x, int rows, int cols,
                                                                      uint32_t signs, float* amax_out,
                                                                      float* source_amax_out) {
  const int pairs = cols / 2;
  const size_t items = static_cast<size_t>(rows / kRotatedAmaxRows) * pairs;
  const size_t id = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned amax = 0, source_amax = 0;
  if (id < items) {
    const size_t g = id / pairs;
    const int p = static_cast<int>(id % pairs);
    const __nv_bfloat162* src =
        reinterpret_cast<const __nv_bfloat162*>(x + g * kRotatedAmaxRows * static_cast<size_t>(cols)) + p;
    float lo[kRotatedAmaxRows], hi[kRotatedAmaxRows];
#pragma unroll
    for (int j = 0; j < kRotatedAmaxRows; j++) {
      const float2 v = __bfloat1622float2(src[static_cast<size_t>(j) * pairs]);
      lo[j] = v.x, hi[j] = v.y;
    }
    if (source_amax_out) {
#pragma unroll
      for (int j = 0; j < kRotatedAmaxRows; j++)
        source_amax = max(source_amax, max(__float_as_uint(fabsf(lo[j])), __float_as_uint(fabsf(hi[j]))));
    }
    hadamard_transform<kRotatedAmaxRows>(lo, signs);
    hadamard_transform<kRotatedAmaxRows>(hi, signs);
#pragma unroll
    for (int j = 0; j < kRotatedAmaxRows; j++)
      amax = max(amax, max(__float_as_uint(fabsf(lo[j])), __float_as_uint(fabsf(hi[j]))));
  }
  cta_atomic_max_amax2(amax_out, amax, source_amax_out, source_amax);
}

constexpr int kTileSide = 16;

struct TileArgs {
  const bf16* x;
  int rows, cols, row_tiles, col_tiles;
  uint8_t* data;
  uint8_t* scales;    // [rb * ld + cb]
  uint8_t* data_t;
  uint8_t* scales_t;  // [cb * ld_t + rb]
  int ld, ld_t;
  const float* tensor_amax;
  float* tensor_scale_inv;
  float* tensor_scale_inv_t;
  bool stochastic;
  StochasticKey key;
};

__device__ inline void store_tile_row(uint8_t* dst, uint2 codes, int n, bool vector) {
  if (vector) {
    *reinterpret_cast<uint2*>(dst) = codes;
  } else {
    for (int b = 0; b < (n + 1) / 2; b++) dst[b] = static_cast<uint8_t>((b < 4 ? codes.x : codes.y) >> (8 * (b % 4)));
  }
}

// The 16 x 16 matrix of 4-bit codes held by 16 consecutive lanes (lane j: row j, its column i in nibble i % 8 of
// word i / 8) transposed in place: lane j ends with column j. Each stage s = 8, 4, 2, 1 swaps bit s of the row index
// with bit s of the column index: lanes j and j ^ s exchange the nibble groups that the other keeps in its rows (the
// lower lane's columns with bit s set for the upper lane's columns with it clear). Every lane of the warp calls it.
__device__ inline uint2 transpose_nibbles16(uint2 row, int j) {
  {
    const bool upper = j & 8;  // s = 8: whole words
    const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? row.x : row.y, 8);
    if (upper) row.x = got;
    else row.y = got;
  }
  uint32_t w[2] = {row.x, row.y};
#pragma unroll
  for (int s = 4; s >= 1; s /= 2) {
    const int d = 4 * s;  // bits per group
    const uint32_t m = s == 4 ? 0x0000FFFFu : s == 2 ? 0x00FF00FFu : 0x0F0F0F0Fu;  // groups with bit s clear
    const bool upper = j & s;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? (w[h] & m) << d : (w[h] >> d) & m, s);
      w[h] = (w[h] & (upper ? ~m : m)) | got;
    }
  }
  return make_uint2(w[0], w[1]);
}

__global__ void __launch_bounds__(kThreads) fp4_tile_kernel(const TileArgs a) {
  const size_t id = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t tile = id / kTileSide;
  const int j = static_cast<int>(id % kTileSide);
  const bool active = tile < static_cast<size_t>(a.row_tiles) * a.col_tiles;
  const int rb = active ? static_cast<int>(tile / a.col_tiles) : 0;
  const int cb = active ? static_cast<int>(tile % a.col_tiles) : 0;
  const int r0 = rb * kTileSide, c0 = cb * kTileSide;
  const int tile_rows = active ? min(kTileSide, a.rows - r0) : 0, tile_cols = active ? min(kTileSide, a.cols - c0) : 0;
  float row[kTileSide];  // row j of the tile; zeros outside
  const bf16* src = a.x + static_cast<size_t>(r0 + j) * a.cols + c0;
  if (j < tile_rows && tile_cols == kTileSide && a.cols % 8 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const x128 packed = load128(src + 8 * h);
#pragma unroll
      for (int k = 0; k < 8; k++) row[8 * h + k] = __bfloat162float(packed[k]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kTileSide; i++) row[i] = j < tile_rows && i < tile_cols ? load_x(src, i) : 0.0f;
  }
  unsigned amax = 0;
#pragma unroll
  for (int i = 0; i < kTileSide; i++) amax = max(amax, __float_as_uint(fabsf(row[i])));
#pragma unroll
  for (int k = kTileSide / 2; k >= 1; k /= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, k, kTileSide));
  const float s_enc = nvfp4_tensor_encode_scale(a.tensor_amax[0]);
  uint8_t scale_code;
  float multiplier;
  block_scale(true, s_enc, amax, &scale_code, &multiplier);
  // Row j's codes (zeros past the tile's edges), and the tile's transpose for data_t: element (i, j) of data_t is
  // element (j, i) of data, with the same value, scale and random draw (its index in data's layout), so the same code.
  uint32_t packed[2];
  block_codes<kTileSide>(row, tile_cols, multiplier, a.stochastic, a.key,
                         static_cast<uint64_t>(r0 + j) * a.cols + c0, 0, packed);
  const uint2 codes = make_uint2(packed[0], packed[1]);
  const uint2 codes_t = a.data_t ? transpose_nibbles16(codes, j) : codes;  // a.data_t: the same for the whole grid
  if (!active) return;
  if (id == 0) {
    if (a.tensor_scale_inv && a.data) a.tensor_scale_inv[0] = div_rn(1.0f, s_enc);
    if (a.tensor_scale_inv_t && a.data_t) a.tensor_scale_inv_t[0] = div_rn(1.0f, s_enc);
  }
  if (j == 0) {
    if (a.data) a.scales[static_cast<size_t>(rb) * a.ld + cb] = scale_code;
    if (a.data_t) a.scales_t[static_cast<size_t>(cb) * a.ld_t + rb] = scale_code;
  }
  if (a.data && j < tile_rows) {
    const size_t row_bytes = (static_cast<size_t>(a.cols) + 1) / 2;
    store_tile_row(a.data + static_cast<size_t>(r0 + j) * row_bytes + c0 / 2, codes, tile_cols,
                   tile_cols == kTileSide && row_bytes % 8 == 0);
  }
  if (a.data_t && j < tile_cols) {
    const size_t row_bytes_t = (static_cast<size_t>(a.rows) + 1) / 2;
    store_tile_row(a.data_t + static_cast<size_t>(c0 + j) * row_bytes_t + r0 / 2, codes_t, tile_rows,
                   tile_rows == kTileSide && row_bytes_t % 8 == 0);
  }
}

unsigned grid_of(size_t threads, const char* who) {
  const size_t blocks = ceil_div(threads, kThreads);
  if (blocks > 0x7fffffffu) throw_error("%s: %zu thread blocks exceed the grid limit", who, blocks);
  return static_cast<unsigned>(std::max<size_t>(blocks, 1));
}

void launch_run(const RunArgs& a, int block_len, cudaStream_t stream) {
  const size_t tiles = block_len == 16 ? run_tiles<16>(a.rows, a.cols) : run_tiles<32>(a.rows, a.cols);
  if (tiles == 0) return;
  if (tiles > 0x7fffffffu) throw_error("fp4_quantize: %zu tiles exceed the grid limit", tiles);
  const unsigned grid = static_cast<unsigned>(tiles);
  if (block_len == 16)
    fp4_run_kernel<16><<<grid, kThreads, 0, stream>>>(a);
  else
    fp4_run_kernel<32><<<grid, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

// Whether q asks for its data (data_t) copy: as codes, as NVFP4 values, or both.
bool wants_data(const QTensor& q) { return q.data != nullptr || q.values != nullptr; }
bool wants_data_t(const QTensor& q) { return q.data_t != nullptr || q.values_t != nullptr; }

void check_options(const char* who, const QTensor& q, const QuantizeArgs& args) {
  if (args.rounding != Rounding::Nearest && args.rounding != Rounding::Stochastic)
    throw_error("%s: unknown rounding %d", who, static_cast<int>(args.rounding));
  if (args.mxfp4_scale != Mxfp4Scale::Amax && args.mxfp4_scale != Mxfp4Scale::Gaussian &&
      args.mxfp4_scale != Mxfp4Scale::RangeMatched)
    throw_error("%s: unknown mxfp4_scale %d", who, static_cast<int>(args.mxfp4_scale));
  const bool mxfp4 = mxfp4_encoding(q.encoding);
  if (args.mxfp4_scale == Mxfp4Scale::RangeMatched && !mxfp4)
    throw_error("%s: range-matched (Quartet backward) block scales are an MXFP4 rule; %s has its own", who,
                encoding_name(q.encoding).c_str());
  if (args.mxfp4_scale == Mxfp4Scale::Gaussian) {
    if (!mxfp4)
      throw_error("%s: Gaussian (QuEST) block scales are an MXFP4 rule; %s has its own", who,
                  encoding_name(q.encoding).c_str());
    if ((q.data && q.cols % kGaussianBlock != 0) || (q.data_t && q.rows % kGaussianBlock != 0))
      throw_error("%s: Gaussian block scales take whole blocks of %d; (%d, %d) has a partial one along a quantised "
                  "direction", who, kGaussianBlock, q.rows, q.cols);
  }
  if (args.trust_mask && (!mxfp4 || !q.data))
    throw_error("%s: a trust mask is kept for the data copy of an MXFP4 tensor (%s%s)", who,
                encoding_name(q.encoding).c_str(), q.data ? "" : ", no data copy asked for");
  const HadamardOption& h = args.hadamard;
  if (!h.any()) return;
  const BlockShape b = q.encoding.block;
  if (b.rows != 1)
    throw_error("%s: a Hadamard transform rotates 1xN blocks; %s has %s tiles (the codes serve both directions)", who,
                encoding_name(q.encoding).c_str(), block_shape_name(b).c_str());
  if (h.size != 16 && h.size != 32)
    throw_error("%s: hadamard.size = %d; the block Hadamard transforms are of size 16 or 32", who, h.size);
  if (b.cols % h.size != 0)
    throw_error("%s: hadamard.size = %d does not divide the %s blocks of %s", who, h.size, block_shape_name(b).c_str(),
                encoding_name(q.encoding).c_str());
  if (h.data && wants_data(q) && q.cols % h.size != 0)
    throw_error("%s: cols = %d must be a multiple of hadamard.size = %d to rotate data", who, q.cols, h.size);
  if (h.data_t && wants_data_t(q) && q.rows % h.size != 0)
    throw_error("%s: rows = %d must be a multiple of hadamard.size = %d to rotate data_t", who, q.rows, h.size);
}

// Stream-ordered scratch of `n` floats, zeroed.
float* scratch_floats(int n, cudaStream_t stream) {
  float* p = nullptr;
  CUDA_CHECK(cudaMallocAsync(&p, sizeof(float) * n, stream));
  CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(float) * n, stream));
  return p;
}

// fp4_quantize from x, or (src non-null) fp4_requantize from src's codes: the same passes; only the tile loads differ.
void quantize_runs(const char* who, const QTensor& q, const bf16* x, const QTensor* src, const QuantizeArgs& args,
                   cudaStream_t stream) {
  const Encoding& e = q.encoding;
  if (!fp4_encoding(e))
    throw_error("%s: q.encoding is %s; the FP4 quantisers take %s", who, encoding_name(e).c_str(), kFp4Doc);
  if (q.rows < 0 || q.cols < 0) throw_error("%s: q.rows = %d, q.cols = %d must be >= 0", who, q.rows, q.cols);
  check_options(who, q, args);
  const bool nvfp4 = nvfp4_encoding(e);
  const bool want_data = wants_data(q), want_data_t = wants_data_t(q);
  if (want_data && !q.scale_inv)
    throw_error("%s: q.data or q.values is set but q.scale_inv (its %s scales) is null", who,
                scale_format_name(e.scale));
  if (want_data_t && !q.scale_inv_t) throw_error("%s: q.data_t or q.values_t is set but q.scale_inv_t is null", who);
  if (nvfp4 && want_data && !q.tensor_scale_inv)
    throw_error("%s: NVFP4 q.data / q.values need q.tensor_scale_inv (their FP32 tensor scale)", who);
  if (nvfp4 && want_data_t && !q.tensor_scale_inv_t)
    throw_error("%s: NVFP4 q.data_t / q.values_t need q.tensor_scale_inv_t", who);
  if (q.values || q.values_t) {  // whole 16-element blocks along the quantised direction, 16-byte aligned rows
    if (e != kNvfp4Encoding)
      throw_error("%s: q.values / q.values_t are for %s (1x16 NVFP4 copies); q is %s", who,
                  encoding_name(kNvfp4Encoding).c_str(), encoding_name(e).c_str());
    if (q.values && (q.cols % 16 != 0 || reinterpret_cast<uintptr_t>(q.values) % 16 != 0))
      throw_error("%s: q.values needs cols (%d) a multiple of 16 and a 16-byte aligned buffer", who, q.cols);
    if (q.values_t && (q.rows % 16 != 0 || reinterpret_cast<uintptr_t>(q.values_t) % 16 != 0))
      throw_error("%s: q.values_t needs rows (%d) a multiple of 16 and a 16-byte aligned buffer", who, q.rows);
  }
  const size_t n = static_cast<size_t>(q.rows) * q.cols;
  if (n > 0 && !x && !src) throw_error("%s: x is null (%d x %d)", who, q.rows, q.cols);
  const uint8_t one = nvfp4 ? kE4M3One : kE8M0One;
  uint8_t* scales = reinterpret_cast<uint8_t*>(q.scale_inv);
  uint8_t* scales_t = reinterpret_cast<uint8_t*>(q.scale_inv_t);
  if (want_data) CUDA_CHECK(cudaMemsetAsync(scales, one, scale_inv_bytes(e, q.rows, q.cols), stream));
  if (want_data_t) CUDA_CHECK(cudaMemsetAsync(scales_t, one, scale_inv_bytes(e, q.cols, q.rows), stream));

  // The source amax: q.amax (overwritten) and, for NVFP4 without a given amax, the tensor amax. NVFP4 copies rotated
  // by a Hadamard transform are scaled from the amax of their rotated values, measured by a pass of their own before
  // any codes are written; the first such pass measures the source amax in the same read (else amax_bf16 does).
  float* scratch = nullptr;  // [0] source amax, [1] rotated data amax, [2] rotated data_t amax
  const bool rotate_data = args.hadamard.any() && args.hadamard.data && want_data;
  const bool rotate_data_t = args.hadamard.any() && args.hadamard.data_t && want_data_t;
  const bool rotated_amax_pass = nvfp4 && e.block.rows == 1 && (rotate_data || rotate_data_t);
  const bool measure_source = (nvfp4 && !args.amax) || q.amax;
  if (nvfp4 || q.amax) scratch = scratch_floats(3, stream);
  const float* source_amax = args.amax;
  if (measure_source) {
    if (n > 0 && !rotated_amax_pass) amax_bf16(scratch, x, n, stream);
    if (!source_amax) source_amax = scratch;
  }
  if (n == 0) {
    if (q.amax) CUDA_CHECK(cudaMemcpyAsync(q.amax, scratch, sizeof(float), cudaMemcpyDeviceToDevice, stream));
    if (scratch) CUDA_CHECK(cudaFreeAsync(scratch, stream));
    return;
  }

  if (e.block == kBlock16x16) {
    TileArgs t{};
    t.x = x;
    t.rows = q.rows, t.cols = q.cols;
    t.row_tiles = static_cast<int>(ceil_div(q.rows, kTileSide));
    t.col_tiles = static_cast<int>(ceil_div(q.cols, kTileSide));
    t.data = q.data, t.scales = scales, t.data_t = q.data_t, t.scales_t = scales_t;
    t.ld = scale_inv_ld(e, q.rows, q.cols), t.ld_t = scale_inv_ld(e, q.cols, q.rows);
    t.tensor_amax = source_amax;
    t.tensor_scale_inv = q.tensor_scale_inv, t.tensor_scale_inv_t = q.tensor_scale_inv_t;
    t.stochastic = args.rounding == Rounding::Stochastic;
    t.key = args.sr_key;
    if (q.data || q.data_t) {
      const size_t threads = static_cast<size_t>(t.row_tiles) * t.col_tiles * kTileSide;
      fp4_tile_kernel<<<grid_of(threads, who), kThreads, 0, stream>>>(t);
      CUDA_CHECK_LAUNCH();
    }
  } else {
    RunArgs runs[2];
    for (int copy = 0; copy < 2; copy++) {
      RunArgs& a = runs[copy];
      a = RunArgs{};
      a.x = x;
      a.rows = q.rows, a.cols = q.cols;
      a.column = copy == 1;
      a.vector_loads = q.cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
      if (src) {
        a.src_codes = src->data;
        a.src_scales = reinterpret_cast<const uint8_t*>(src->scale_inv);
        a.src_ld = scale_inv_ld(src->encoding, src->rows, src->cols);
        a.vector_loads = q.cols % 8 == 0 && reinterpret_cast<uintptr_t>(src->data) % 4 == 0;
      }
      a.out_rows = a.column ? q.cols : q.rows, a.out_cols = a.column ? q.rows : q.cols;
      a.ld = scale_inv_ld(e, a.out_rows, a.out_cols);
      a.blocks_per_row = static_cast<int>(ceil_div(a.out_cols, e.block.cols));
      a.nvfp4 = nvfp4;
      a.stochastic = args.rounding == Rounding::Stochastic;
      a.key = args.sr_key;
      a.copy = copy;
      a.hadamard = (copy == 0 ? rotate_data : rotate_data_t) ? args.hadamard.size : 0;
      a.signs = args.hadamard.signs;
      a.tensor_amax = source_amax;
      a.mxfp4_scale = args.mxfp4_scale;
      a.trust_mask = copy == 0 ? args.trust_mask : nullptr;
    }
    bool source_pending = measure_source && rotated_amax_pass;
    for (int copy = 0; copy < 2; copy++) {  // the rotated copies' amax passes
      RunArgs& a = runs[copy];
      if (!(copy == 0 ? want_data : want_data_t) || a.hadamard == 0 || !nvfp4) continue;
      a.amax_out = scratch + 1 + copy;
      a.source_amax_out = source_pending ? scratch : nullptr;
      source_pending = false;
      const bool columns_of_pairs = a.column && a.hadamard == kRotatedAmaxRows && a.x && q.cols % 2 == 0 &&
                                    reinterpret_cast<uintptr_t>(a.x) % 4 == 0;  // rows % 16 == 0: check_options
      if (columns_of_pairs) {
        const size_t threads = static_cast<size_t>(q.rows / kRotatedAmaxRows) * (q.cols / 2);
        rotated_column_amax_kernel<<<grid_of(threads, who), kThreads, 0, stream>>>(a.x, q.rows, q.cols, a.signs,
                                                                                   a.amax_out, a.source_amax_out);
        CUDA_CHECK_LAUNCH();
      } else {
        launch_run(a, e.block.cols, stream);
      }
      a.amax_out = nullptr;
      a.source_amax_out = nullptr;
      a.tensor_amax = scratch + 1 + copy;
    }
    for (int copy = 0; copy < 2; copy++) {
      RunArgs& a = runs[copy];
      a.codes = copy == 0 ? q.data : q.data_t;
      a.values = copy == 0 ? q.values : q.values_t;
      if (!a.codes && !a.values) continue;
      a.scales = copy == 0 ? scales : scales_t;
      a.tensor_scale_inv = nvfp4 ? (copy == 0 ? q.tensor_scale_inv : q.tensor_scale_inv_t) : nullptr;
      launch_run(a, e.block.cols, stream);
    }
  }
  if (q.amax) CUDA_CHECK(cudaMemcpyAsync(q.amax, scratch, sizeof(float), cudaMemcpyDeviceToDevice, stream));
  if (scratch) CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

}  // namespace

void fp4_quantize(const QTensor& q, const bf16* x, const QuantizeArgs& args, cudaStream_t stream) {
  quantize_runs("fp4_quantize", q, x, nullptr, args, stream);
}

void fp4_requantize(const QTensor& q, const QTensor& src, const QuantizeArgs& args, cudaStream_t stream) {
  const char* who = "fp4_requantize";
  if (!mxfp4_encoding(src.encoding) || !mxfp4_encoding(q.encoding))
    throw_error("%s: src is %s and q is %s; it re-quantises MXFP4 codes into MXFP4 (%s)", who,
                encoding_name(src.encoding).c_str(), encoding_name(q.encoding).c_str(),
                encoding_name(kMxfp4Encoding).c_str());
  if (src.rows != q.rows || src.cols != q.cols)
    throw_error("%s: src is %d x %d and q is %d x %d; they must have one shape", who, src.rows, src.cols, q.rows,
                q.cols);
  if (q.amax) throw_error("%s: q.amax is set; the amax of an FP4 source is not measured here", who);
  if (static_cast<size_t>(q.rows) * q.cols > 0 && (!src.data || !src.scale_inv))
    throw_error("%s: src.data and src.scale_inv (its row-wise codes and scales) must be device pointers", who);
  quantize_runs(who, q, nullptr, &src, args, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// Dequantisation: one thread per 8 consecutive elements of a row (8 divides every block length, so one scale code).
// `vector`: cols % 8 == 0 and the pointers aligned, so the 8 codes are one 32-bit load and the values one (bf16) or
// two (float) 128-bit stores.
__device__ inline void store_values(float* out, const float (&v)[8]) {
  store128(out, f128{{v[0], v[1], v[2], v[3]}});
  store128(out + 4, f128{{v[4], v[5], v[6], v[7]}});
}
__device__ inline void store_values(bf16* out, const float (&v)[8]) {
  x128 packed;
#pragma unroll
  for (int k = 0; k < 8; k++) packed[k] = __float2bfloat16_rn(v[k]);
  store128(out, packed);
}
__device__ inline void store_value(float* out, size_t i, float v) { out[i] = v; }
__device__ inline void store_value(bf16* out, size_t i, float v) { out[i] = __float2bfloat16_rn(v); }

template <class Out>
__global__ void __launch_bounds__(kThreads) fp4_dequantize_kernel(Out* out, const uint8_t* codes,
                                                                  const uint8_t* scales, const float* tensor_scale_inv,
                                                                  int rows, int cols, BlockShape block, int ld,
                                                                  bool nvfp4, bool vector) {
  const int chunks = (cols + 7) / 8;
  const size_t id = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= static_cast<size_t>(rows) * chunks) return;
  const int r = static_cast<int>(id / chunks), c0 = static_cast<int>(id % chunks) * 8;
  const size_t row_bytes = (static_cast<size_t>(cols) + 1) / 2;
  const uint8_t* row = codes + static_cast<size_t>(r) * row_bytes;
  const uint8_t s = scales[scale_index(block, r, c0, ld)];
  const float tsi = nvfp4 ? tensor_scale_inv[0] : 1.0f;
  Out* dst = out + static_cast<size_t>(r) * cols + c0;
  if (vector) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(row + c0 / 2);
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = dequantized_value(static_cast<uint8_t>((word >> (4 * k)) & 0xFu), s, tsi, nvfp4);
    store_values(dst, v);
  } else {
    for (int k = 0; k < 8 && c0 + k < cols; k++)
      store_value(dst, k, dequantized_value(e2m1_nibble(row[(c0 + k) / 2], c0 + k), s, tsi, nvfp4));
  }
}

// Launches fp4_dequantize_kernel over a (rows, cols) copy.
template <class Out>
void launch_dequantize(Out* out, const uint8_t* codes, const uint8_t* scales, const float* tsi, int rows, int cols,
                       const Encoding& e, bool nvfp4, const char* who, cudaStream_t stream) {
  const size_t threads = static_cast<size_t>(rows) * ceil_div(cols, 8);
  const bool vector = cols % 8 == 0 && reinterpret_cast<uintptr_t>(codes) % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
  fp4_dequantize_kernel<<<grid_of(threads, who), kThreads, 0, stream>>>(out, codes, scales, tsi, rows, cols, e.block,
                                                                       scale_inv_ld(e, rows, cols), nvfp4, vector);
  CUDA_CHECK_LAUNCH();
}

void fp4_dequantize(bf16* out, const QTensor& q, bool transposed, cudaStream_t stream) {
  const char* who = "fp4_dequantize (bf16)";
  if (!mxfp4_encoding(q.encoding))
    throw_error("%s: q.encoding is %s; only MXFP4 values are exact in BF16", who, encoding_name(q.encoding).c_str());
  const uint8_t* codes = transposed ? q.data_t : q.data;
  const uint8_t* scales = reinterpret_cast<const uint8_t*>(transposed ? q.scale_inv_t : q.scale_inv);
  const int rows = transposed ? q.cols : q.rows, cols = transposed ? q.rows : q.cols;
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  if (!out || !codes || !scales) throw_error("%s: out, the codes and their scales must be device pointers", who);
  launch_dequantize(out, codes, scales, nullptr, rows, cols, q.encoding, false, who, stream);
}

// Quartet's backward epilogue: each 32-element run of a row is held by 32 / E consecutive lanes, lane j holding its
// elements E j .. E j + E - 1 (E = 4: 16-byte loads, whole runs only; E = 1: any cols). The inverse rotation is
// hadamard_transform<32>'s butterflies: a stage h < E inside the lane's registers, a stage h >= E by shuffles with the
// lane h / E away; either way the element with bit h clear becomes a + b and its partner a - b, with a the lower
// element and b the upper, the same FP32 operations in the same order.
template <int E>
__global__ void __launch_bounds__(kThreads) mxfp4_gradient_epilogue_kernel(bf16* out_bf16, float* out_fp32,
                                                                           const float* g, const uint32_t* mask,
                                                                           int rows, int cols, float factor,
                                                                           int hadamard, uint32_t signs) {
  constexpr int N = kGaussianBlock, L = N / E;  // lanes per run
  static_assert(N == kWarpSize && (E == 1 || E == 4), "a run is a warp of single elements or 8 lanes of four");
  const int runs = (cols + N - 1) / N;
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t run = thread / L;
  const int j = static_cast<int>(thread % L);
  const bool active = run < static_cast<size_t>(rows) * runs;  // the lanes past the end shuffle zeros
  const int r = active ? static_cast<int>(run / runs) : 0, kb = active ? static_cast<int>(run % runs) : 0;
  const int c0 = kb * N, n = active ? min(N, cols - c0) : 0;
  const size_t i = static_cast<size_t>(r) * cols + c0 + E * j;  // the lane's first element
  const uint32_t bits = !active ? 0u : mask ? mask[static_cast<size_t>(r) * runs + kb] : 0xFFFFFFFFu;
  float v[E];
  if constexpr (E == 4) {
    const float4 q = active ? *reinterpret_cast<const float4*>(g + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    v[0] = E * j < n ? g[i] : 0.0f;
  }
#pragma unroll
  for (int e = 0; e < E; e++) v[e] = (bits >> (E * j + e)) & 1u ? mul_rn(v[e], factor) : 0.0f;
  if (hadamard == N) {  // cols % 32 == 0: every lane holds whole elements
#pragma unroll
    for (int h = 1; h < N; h *= 2) {
      if (h < E) {
#pragma unroll
        for (int e = 0; e < E; e++)
          if (!(e & h)) {
            const float a = v[e], b = v[e + h];
            v[e] = add_rn(a, b);
            v[e + h] = add_rn(a, -b);
          }
      } else {
        const bool upper = j & (h / E);
#pragma unroll
        for (int e = 0; e < E; e++) {
          const float other = __shfl_xor_sync(0xffffffffu, v[e], h / E);
          v[e] = upper ? add_rn(other, -v[e]) : add_rn(v[e], other);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < E; e++) {
      v[e] = mul_rn(v[e], HadamardNorm<N>::value);
      if ((signs >> (E * j + e)) & 1u) v[e] = -v[e];  // S after H: the inverse of the forward's H·S
    }
  }
  if (E * j >= n) return;
  if constexpr (E == 4) {
    if (out_bf16) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
      *reinterpret_cast<uint2*>(out_bf16 + i) =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    } else {
      float4 acc = *reinterpret_cast<const float4*>(out_fp32 + i);
      acc.x = add_rn(acc.x, v[0]), acc.y = add_rn(acc.y, v[1]);
      acc.z = add_rn(acc.z, v[2]), acc.w = add_rn(acc.w, v[3]);
      *reinterpret_cast<float4*>(out_fp32 + i) = acc;
    }
  } else {
    if (out_bf16)
      out_bf16[i] = __float2bfloat16_rn(v[0]);
    else
      out_fp32[i] = add_rn(out_fp32[i], v[0]);
  }
}

void mxfp4_gradient_epilogue(bf16* out_bf16, float* out_fp32, const float* g, const uint32_t* mask, int rows, int cols,
                             float factor, int hadamard, uint32_t signs, cudaStream_t stream) {
  const char* who = "mxfp4_gradient_epilogue";
  if ((out_bf16 == nullptr) == (out_fp32 == nullptr))
    throw_error("%s: exactly one of out_bf16 and out_fp32 must be given", who);
  if (rows < 0 || cols < 0) throw_error("%s: rows = %d, cols = %d must be >= 0", who, rows, cols);
  if (hadamard != 0 && hadamard != kGaussianBlock)
    throw_error("%s: hadamard = %d; the inverse rotation is of size 0 (none) or %d", who, hadamard, kGaussianBlock);
  if (hadamard != 0 && cols % hadamard != 0)
    throw_error("%s: cols = %d must be a multiple of hadamard = %d", who, cols, hadamard);
  if (hadamard == 0 && signs != 0)
    throw_error("%s: signs = 0x%08x without a rotation (hadamard = 0); the signs belong to the rotation", who, signs);
  const size_t run_lanes = static_cast<size_t>(rows) * ceil_div(cols, kGaussianBlock) * kWarpSize;
  if (run_lanes == 0) return;
  if (!g) throw_error("%s: g is null", who);
  const auto aligned = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (cols % kGaussianBlock == 0 && aligned(g, 16) && (out_bf16 ? aligned(out_bf16, 8) : aligned(out_fp32, 16)))
    mxfp4_gradient_epilogue_kernel<4><<<grid_of(run_lanes / 4, who), kThreads, 0, stream>>>(
        out_bf16, out_fp32, g, mask, rows, cols, factor, hadamard, signs);
  else
    mxfp4_gradient_epilogue_kernel<1><<<grid_of(run_lanes, who), kThreads, 0, stream>>>(
        out_bf16, out_fp32, g, mask, rows, cols, factor, hadamard, signs);
  CUDA_CHECK_LAUNCH();
}

void fp4_dequantize(float* out, const QTensor& q, bool transposed, cudaStream_t stream) {
  const char* who = "fp4_dequantize";
  if (!fp4_encoding(q.encoding))
    throw_error("%s: q.encoding is %s; the FP4 kernels take %s", who, encoding_name(q.encoding).c_str(), kFp4Doc);
  const uint8_t* codes = transposed ? q.data_t : q.data;
  const uint8_t* scales = reinterpret_cast<const uint8_t*>(transposed ? q.scale_inv_t : q.scale_inv);
  const float* tsi = transposed ? q.tensor_scale_inv_t : q.tensor_scale_inv;
  const int rows = transposed ? q.cols : q.rows, cols = transposed ? q.rows : q.cols;
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  const bool nvfp4 = nvfp4_encoding(q.encoding);
  if (!out || !codes || !scales || (nvfp4 && !tsi))
    throw_error("%s: out, the codes, their scales%s must be device pointers", who,
                nvfp4 ? " and the tensor scale" : "");
  launch_dequantize(out, codes, scales, tsi, rows, cols, q.encoding, nvfp4, who, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// Telemetry: a fixed grid strides over the elements in a fixed pattern; each block reduces its threads' sums in a
// fixed order (block_sum) into a partials array; one block combines them in a fixed order (as fp8_quant_stats).
// The clipped count needs each element's multiplier as the quantiser computed it: MXFP4 from the stored scale code,
// NVFP4 also from the tensor's encode scale, which comes from the tensor amax of the copy: tensor_amax, a device
// double (the amax slot of a previous pass's statistics), or null for a pass that counts nothing clipped.
constexpr int kStatsBlocks = kQuantStatsBlocks;

// The decode scale of a block: its scale value (times the tensor's decode scale for NVFP4).
__device__ inline float block_decode_scale(uint8_t s, bool nvfp4, float tsi) {
  return nvfp4 ? mul_rn(e4m3_value(s), tsi) : e8m0_value(s);
}

__global__ void __launch_bounds__(kThreads) fp4_quant_stats_kernel(double* partials, const bf16* x,
                                                                   const uint8_t* codes, const uint8_t* scales,
                                                                   const float* tensor_scale_inv, int rows, int cols,
                                                                   BlockShape block, int ld, int scale_rows,
                                                                   int scale_cols, bool nvfp4, int hadamard,
                                                                   uint32_t signs, bool range_matched,
                                                                   const double* tensor_amax) {
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t n = static_cast<size_t>(rows) * cols;
  const size_t row_bytes = (static_cast<size_t>(cols) + 1) / 2;
  const float tsi = nvfp4 ? tensor_scale_inv[0] : 1.0f;
  const bool count_clipped = !nvfp4 || tensor_amax != nullptr;
  const float s_enc = nvfp4 && tensor_amax ? nvfp4_tensor_encode_scale(static_cast<float>(tensor_amax[0])) : 1.0f;
  double sum_x2 = 0.0, sum_err2 = 0.0, saturated = 0.0, underflow = 0.0, nonzero = 0.0, clipped = 0.0;
  unsigned amax = 0, max_scale = 0;
  for (size_t i = thread; i < n; i += stride) {
    const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
    const uint8_t code = e2m1_nibble(codes[r * row_bytes + c / 2], c);
    float xf = load_x(x, i);
    if (hadamard != 0) {  // the rotated value the quantiser saw
      float v[32];
      const int c0 = c - c % hadamard;
      for (int j = 0; j < hadamard; j++) v[j] = load_x(x, static_cast<size_t>(r) * cols + c0 + j);
      hadamard_transform_n(v, hadamard, signs);
      xf = v[c - c0];
    }
    const uint8_t s = scales[scale_index(block, r, c, ld)];
    const float deq =
        nvfp4 ? mul_rn(mul_rn(e2m1_value(code), e4m3_value(s)), tsi) : mul_rn(e2m1_value(code), e8m0_value(s));
    const double err = static_cast<double>(xf) - fp4_represented_value(deq, range_matched);
    sum_x2 += static_cast<double>(xf) * xf;
    sum_err2 += err * err;
    nonzero += xf != 0.0f;
    underflow += xf != 0.0f && (code & 0x7) == 0;
    saturated += (code & 0x7) == 0x7;
    if (count_clipped) {
      const float m = nvfp4 ? nvfp4_element_multiplier(s, s_enc)
                            : range_matched ? mxfp4_range_matched_multiplier(s) : mxfp4_element_multiplier(s);
      clipped += e2m1_clipped(xf, m);
    }
    amax = max(amax, __float_as_uint(fabsf(xf)));
  }
  const size_t entries = static_cast<size_t>(scale_rows) * scale_cols;
  for (size_t e = thread; e < entries; e += stride)
    max_scale =
        max(max_scale,
            __float_as_uint(fabsf(block_decode_scale(scales[(e / scale_cols) * ld + e % scale_cols], nvfp4, tsi))));
  double sums[kQuantStatsSlots] = {};
  sums[kStatSaturated] = block_sum(saturated);
  sums[kStatUnderflow] = block_sum(underflow);
  sums[kStatNonzero] = block_sum(nonzero);
  sums[kStatSumX2] = block_sum(sum_x2);
  sums[kStatSumErr2] = block_sum(sum_err2);
  sums[kStatClipped] = block_sum(clipped);
  __shared__ unsigned maxes[2][kThreads / kWarpSize];
  amax = warp_max_bits(amax);
  max_scale = warp_max_bits(max_scale);
  if (threadIdx.x % kWarpSize == 0)
    maxes[0][threadIdx.x / kWarpSize] = amax, maxes[1][threadIdx.x / kWarpSize] = max_scale;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / kWarpSize; w++)
      amax = max(amax, maxes[0][w]), max_scale = max(max_scale, maxes[1][w]);
    double* p = partials + static_cast<size_t>(blockIdx.x) * kQuantStatsSlots;
    for (int k = 0; k < kQuantStatsSlots; k++) p[k] = sums[k];
    p[kStatAmax] = amax;
    p[kStatScale] = max_scale;
  }
}

void fp4_quant_stats(double* stats_out, const QTensor& q, const bf16* x, const HadamardOption& rotation,
                     Mxfp4Scale mxfp4_scale, cudaStream_t stream) {
  const char* who = "fp4_quant_stats";
  if (!fp4_encoding(q.encoding))
    throw_error("%s: q.encoding is %s; the FP4 kernels take %s", who, encoding_name(q.encoding).c_str(), kFp4Doc);
  const int hadamard = rotation.any() && rotation.data ? rotation.size : 0;
  if (hadamard != 0 && ((hadamard != 16 && hadamard != 32) || q.cols % hadamard != 0))
    throw_error("%s: a rotation of size %d along cols = %d (16 or 32, dividing cols)", who, hadamard, q.cols);
  const bool nvfp4 = nvfp4_encoding(q.encoding);
  if (nvfp4 && mxfp4_scale != Mxfp4Scale::Amax)
    throw_error("%s: mxfp4_scale is an MXFP4 option and q is %s; pass Mxfp4Scale::Amax (the default)", who,
                encoding_name(q.encoding).c_str());
  if (!stats_out || !x || !q.data || !q.scale_inv || (nvfp4 && !q.tensor_scale_inv))
    throw_error("%s: stats_out, x, q.data, q.scale_inv%s must be device pointers", who,
                nvfp4 ? " and q.tensor_scale_inv" : "");
  int scale_rows = 0, scale_cols = 0;
  valid_scale_shape(q.encoding, q.rows, q.cols, &scale_rows, &scale_cols);
  double* partials = nullptr;
  CUDA_CHECK(cudaMallocAsync(&partials, sizeof(double) * kStatsBlocks * kQuantStatsSlots, stream));
  // NVFP4: a first pass for the tensor amax of the encode scale (its other sums are measured again by the second).
  for (int pass = nvfp4 ? 0 : 1; pass < 2; pass++) {
    fp4_quant_stats_kernel<<<kStatsBlocks, kThreads, 0, stream>>>(
        partials, x, q.data, reinterpret_cast<const uint8_t*>(q.scale_inv), q.tensor_scale_inv, q.rows, q.cols,
        q.encoding.block, scale_inv_ld(q.encoding, q.rows, q.cols), scale_rows, scale_cols, nvfp4, hadamard,
        rotation.signs, mxfp4_scale == Mxfp4Scale::RangeMatched, pass == 1 && nvfp4 ? stats_out + kStatAmax : nullptr);
    CUDA_CHECK_LAUNCH();
    combine_quant_stats(stats_out, partials, static_cast<double>(q.rows) * q.cols, stream);
  }
  CUDA_CHECK(cudaFreeAsync(partials, stream));
}

}  // namespace llmc
