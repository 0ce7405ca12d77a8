// llmc/precision/fp4_remap.cuh: the element arithmetic that carries FP4 operands onto Hopper's tensor cores exactly,
// compiled on both sides (the kernels of llmc/precision/fp4_gemm.cu; the CPU test enumerates it against the E4M3
// codec of llmc/core/dtypes.h): an MXFP4 element re-encoded as E4M3 under a power-of-two outer scale, and an NVFP4
// element expanded into BF16.
//
// MXFP4 -> E4M3. An E2M1 magnitude is sig * 2^p with sig in {1, 1.5} and p in {-1, 0, 1, 2} (0.5 = 1 * 2^-1,
// 1, 1.5, 2 = 1 * 2^1, 3 = 1.5 * 2^1, 4 = 1 * 2^2, 6 = 1.5 * 2^2); the element of a block with E8M0 scale 2^X is
// sig * 2^E, E = X + p. Under an outer scale 2^R it must become the E4M3 value sig * 2^(E - R). E4M3 (e4m3fn: bias 7,
// normals 2^-6 .. 1.75 * 2^8 = 448, subnormals m * 2^-9 for m = 1 .. 7) holds sig * 2^e exactly iff
//   e <= 8                 (1 * 2^8 = 256 and 1.5 * 2^8 = 384 are normals; 2^9 = 512 is above 448), and
//   e >= -9 for sig = 1    (2^-9 is the least subnormal),
//   e >= -8 for sig = 1.5  (1.5 * 2^e = 3 * 2^(e-1) is a multiple of 2^-9 only from e = -8: the subnormal edge, where
//                           the one mantissa bit of 1.5 needs a subnormal step of 2^(e-1)).
// Zero is exact at any shift (+-0, the sign kept). So a whole block (all eight magnitudes) is exact for block shifts
// k = X - R in [-8, 6] (fp4_recipes.md §0: 6 * 2^6 = 384; 0.5 * 2^-8 and 1.5 * 2^-8 = 3 * 2^-9 are subnormals), and
// element by element over the wider ranges above (0.5: k in [-8, 9]; 1: [-9, 8]; 1.5: [-8, 8]; 2: [-10, 7];
// 3: [-9, 7]; 4: [-11, 6]; 6: [-10, 6]).
// The outer scale of a run of elements (fp4_gemm.h: a row's 128 consecutive elements) is R = max E - 8 over its
// nonzero elements of finite blocks (0 for a run with none): the largest element lands in E4M3's top binade, nothing
// ever exceeds 448, and an element is exact unless it lies more than 17 binades (16 for sig = 1.5) below the largest.
// An element that is not exact becomes E4M3's round to nearest even of sig * 2^(E - R): a multiple of 2^-9 (its
// subnormal grid), or +-0 at or below 2^-10 (a flush); the kernels count such blocks (fp4_gemm.h). An element of a
// block with the E8M0 NaN scale becomes the E4M3 NaN code 0x7F (its dequantised value is NaN too).
//
// NVFP4 -> BF16. An element is e2m1 * s_b (times the FP32 tensor scale, which the GEMM applies as its alpha): e2m1
// has at most 2 significant bits and an E4M3 scale at most 4, so the product has at most 6 (3 * 15 = 45 = 101101b)
// and lies in [0.5 * 2^-9, 6 * 448] = [2^-10, 2688]; BF16 has 8 significant bits and normal exponents down to -126,
// so the product is exact in FP32 and again in BF16, always. A block with the E4M3 NaN scale gives NaN elements.
#pragma once

#include <climits>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/core/float_rn.cuh"
#include "llmc/precision/fp4_codec.cuh"

namespace llmc {

constexpr int kE4M3TopExponent = 8;      // the largest binade of E4M3 (256 .. 448)
constexpr int kE4M3LeastExponent = -9;   // 2^-9, the least E4M3 subnormal
constexpr uint8_t kE4M3NanCode = 0x7F;

// 2^e as an FP32 (exact), e in [-149, 127]: subnormals below -126.
__host__ __device__ inline float pow2_float(int e) {
  return e >= -126 ? bits_to_float(static_cast<uint32_t>(e + 127) << 23) : bits_to_float(1u << (e + 149));
}

// The exponent p of an E2M1 magnitude code m (1 .. 7: 0.5, 1, 1.5, 2, 3, 4, 6 = sig * 2^p) and whether its
// significand is 1.5.
__host__ __device__ inline int e2m1_exponent(uint8_t code) { return ((code & 0x7) >> 1) - 1; }
__host__ __device__ inline bool e2m1_sig_1_5(uint8_t code) {
  const int m = code & 0x7;
  return (m & 1) && m > 1;
}
// The exponent E of an MXFP4 element: its E2M1 exponent plus the block's (E8M0 code c: X = c - 127).
__host__ __device__ inline int mxfp4_element_exponent(uint8_t e2m1_code, uint8_t e8m0_code) {
  return static_cast<int>(e8m0_code) - kE8M0Bias + e2m1_exponent(e2m1_code);
}

struct E4m3Remap {
  uint8_t code;  // E4M3
  bool exact;    // code * 2^R == e2m1 * 2^X exactly
};
// The E4M3 code of the MXFP4 element (E2M1 code, E8M0 block code) under the outer scale 2^R; the E8M0 NaN code gives
// the E4M3 NaN code (exact: NaN stays NaN).
__host__ __device__ inline E4m3Remap mxfp4_element_to_e4m3(uint8_t e2m1_code, uint8_t e8m0_code, int R) {
  if (e8m0_code == kE8M0NanCode) return {kE4M3NanCode, true};
  const bool negative = (e2m1_code & 0x8) != 0;
  if ((e2m1_code & 0x7) == 0) return {static_cast<uint8_t>(negative ? 0x80 : 0x00), true};
  const int e = mxfp4_element_exponent(e2m1_code, e8m0_code) - R;
  // Clamped to [-30, 30], sig * 2^e is an exact normal FP32 whose E4M3 rounding equals that of the true value (which
  // is below 2^-10, code +-0, or above 448, saturated, whenever the clamp changes it).
  const int ec = e < -30 ? -30 : e > 30 ? 30 : e;
  const float v = mul_rn(e2m1_sig_1_5(e2m1_code) ? 1.5f : 1.0f, pow2_float(ec));
  const uint8_t magnitude = e4m3_rn(v);
  return {static_cast<uint8_t>(magnitude | (negative ? 0x80 : 0x00)), ec == e && e4m3_value(magnitude) == v};
}

// A whole MXFP4 block at once (the remap kernel's inner loop). The block's 32 E2M1 codes are four words, element i
// at bits 4 (i % 8) .. 4 (i % 8) + 3 of word i / 8 (the packed byte order). An element's E4M3 code depends only on its
// 3-bit magnitude and sign once the block's E8M0 code and R are fixed, so the block builds an eight-byte table (the
// codes of magnitudes 0 .. 7) and looks four elements up at a time with one byte permute.
constexpr int kMxfp4BlockWords = 4;

// byte_perm(x, y, s): byte j of the result is byte (s >> 4j) & 7 of the eight bytes y:x (x's low byte is byte 0); the
// PTX prmt (CUDA's __byte_perm) on the device. Every selector nibble must be below 8 (bit 3 would select prmt's
// sign-replicating mode on the device).
__host__ __device__ inline uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t pool = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int j = 0; j < 4; j++) r |= static_cast<uint32_t>((pool >> (8 * ((s >> (4 * j)) & 7))) & 0xFF) << (8 * j);
  return r;
#endif
}

struct Mxfp4BlockRemap {
  uint32_t lo, hi;   // byte m % 4 of lo (m < 4) or hi: the E4M3 code of E2M1 magnitude m (mxfp4_element_to_e4m3's)
  uint32_t sign;     // 0x80808080, or 0 for the NaN scale (whose elements are all the NaN code, sign or not)
  uint32_t inexact;  // bit m: magnitude m's code is not exact
};

// The table of one block (E8M0 code, outer exponent R). For shifts k = X - R in [-5, 6] every nonzero magnitude
// sig * 2^p lands on an E4M3 normal sig * 2^(k + p), code ((k + p + 7) << 3) | (sig = 1.5 ? 4 : 0): the bytes
// 8k + {0, 48, 56, 60, 64, 68, 72, 76} for magnitudes 1 .. 7 (magnitude 0 stays 0x00). Each lies in [8, 124], so the
// 32-bit sums below never carry from byte to byte. Other shifts (blocks far below their run's largest, or a run whose
// largest block holds nothing above 3) take the element function for each magnitude.
__host__ __device__ inline Mxfp4BlockRemap mxfp4_block_remap(uint8_t e8m0_code, int R) {
  if (e8m0_code == kE8M0NanCode) return {0x01010101u * kE4M3NanCode, 0x01010101u * kE4M3NanCode, 0, 0};
  const int k = static_cast<int>(e8m0_code) - kE8M0Bias - R;
  if (k >= -5 && k <= 6) {
    const uint32_t add = static_cast<uint32_t>(8 * k);  // two's complement: the sums below subtract for k < 0
    return {0x3C383000u + add * 0x01010100u, 0x4C484440u + add * 0x01010101u, 0x80808080u, 0};
  }
  Mxfp4BlockRemap t{0, 0, 0x80808080u, 0};
  for (int m = 1; m < 8; m++) {
    const E4m3Remap r = mxfp4_element_to_e4m3(static_cast<uint8_t>(m), e8m0_code, R);
    (m < 4 ? t.lo : t.hi) |= static_cast<uint32_t>(r.code) << (8 * (m % 4));
    if (!r.exact) t.inexact |= 1u << m;
  }
  return t;
}

// The E4M3 codes of the four elements whose E2M1 codes are the nibbles of quad (bits 0 .. 15): the magnitudes are
// looked up in the table; the sign bits, moved to bit 2 of each selector nibble by the shift, pick 0x80 or 0x00.
__host__ __device__ inline uint32_t mxfp4_remap_quad(const Mxfp4BlockRemap& t, uint32_t quad) {
  return byte_perm(t.lo, t.hi, quad & 0x7777u) | byte_perm(0u, t.sign, (quad >> 1) & 0x7777u);
}

// The largest E2M1 exponent p among the nonzero elements of a block's words, INT_MIN for none: 2 if some magnitude
// has bits 1 and 2 (4, 6), else 1 if some has bit 2 (2, 3), 0 if some has bit 1 (1, 1.5), -1 if some is 0.5.
__host__ __device__ inline int mxfp4_block_top_p(const uint32_t (&w)[kMxfp4BlockWords]) {
  uint32_t any = 0, both = 0;
#pragma unroll
  for (int i = 0; i < kMxfp4BlockWords; i++) {
    any |= w[i];
    both |= w[i] & (w[i] >> 1);
  }
  if (both & 0x22222222u) return 2;
  if (any & 0x44444444u) return 1;
  if (any & 0x22222222u) return 0;
  if (any & 0x11111111u) return -1;
  return INT_MIN;
}

// A block's 32 E4M3 codes (out: element i at byte i % 4 of word i / 4) under the outer exponent R; true if some element
// is inexact (mxfp4_element_to_e4m3 element by element, the kernel's count).
__host__ __device__ inline bool mxfp4_block_to_e4m3(const uint32_t (&w)[kMxfp4BlockWords], uint8_t e8m0_code, int R,
                                                    uint32_t (&out)[2 * kMxfp4BlockWords]) {
  const Mxfp4BlockRemap t = mxfp4_block_remap(e8m0_code, R);
#pragma unroll
  for (int i = 0; i < kMxfp4BlockWords; i++) {
    out[2 * i] = mxfp4_remap_quad(t, w[i]);
    out[2 * i + 1] = mxfp4_remap_quad(t, w[i] >> 16);
  }
  if (t.inexact == 0) return false;
  uint32_t flag_lo = 0, flag_hi = 0, flags = 0;  // byte m: 0xFF if magnitude m is inexact
  for (int m = 1; m < 8; m++)
    if (t.inexact & (1u << m)) (m < 4 ? flag_lo : flag_hi) |= 0xFFu << (8 * (m % 4));
#pragma unroll
  for (int i = 0; i < kMxfp4BlockWords; i++)
    flags |= byte_perm(flag_lo, flag_hi, w[i] & 0x7777u) | byte_perm(flag_lo, flag_hi, (w[i] >> 16) & 0x7777u);
  return flags != 0;
}

// The BF16 value of an NVFP4 element without the tensor scale: e2m1 * E4M3 block scale, exact (NaN for the NaN
// scale code).
__host__ __device__ inline float nvfp4_element_value(uint8_t e2m1_code, uint8_t e4m3_code) {
  return mul_rn(e2m1_value(e2m1_code), e4m3_value(e4m3_code));
}

// The BF16 bits of nvfp4_element_value as the device rounds them (__float2bfloat16_rn: exact for every finite scale;
// the canonical NaN 0x7FFF for the NaN scale codes, whatever the element's sign).
__host__ __device__ inline uint32_t nvfp4_element_bf16(uint8_t e2m1_code, uint8_t e4m3_code) {
  const float v = nvfp4_element_value(e2m1_code, e4m3_code);
#ifdef __CUDA_ARCH__
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#else
  return v != v ? 0x7FFFu : float_to_bits(v) >> 16;
#endif
}

// A whole NVFP4 block at once (the expansion kernel's inner loop, and the quantiser's BF16 values): once the block's
// E4M3 code is fixed an element's BF16 bits depend only on its 3-bit magnitude and its sign, so the block builds the
// low and the high bytes of its eight magnitudes' values (two eight-byte tables) and expands four elements at a time
// with byte permutes. An element's sign flips the sign bit of its high byte (the sign of a product: a negative scale
// code gives negative magnitudes, so flipping is the multiplication's rule, zeros included); the NaN scale codes have
// no sign flips (every element 0x7FFF).
struct Nvfp4BlockValues {
  uint32_t lo[2];  // byte m % 4 of lo[m / 4]: the low byte of magnitude m's BF16 value
  uint32_t hi[2];  //                          its high byte
  uint32_t sign;   // 0x80808080, or 0 for the NaN scale codes
};
__host__ __device__ inline Nvfp4BlockValues nvfp4_block_values(uint8_t e4m3_code) {
  uint32_t pair[4];  // magnitudes 2i (low half) and 2i + 1 (high half)
#pragma unroll
  for (int i = 0; i < 4; i++)
    pair[i] = nvfp4_element_bf16(static_cast<uint8_t>(2 * i), e4m3_code) |
              nvfp4_element_bf16(static_cast<uint8_t>(2 * i + 1), e4m3_code) << 16;
  const bool nan = (e4m3_code & 0x7F) == kE4M3NanCode;
  return {{byte_perm(pair[0], pair[1], 0x6420u), byte_perm(pair[2], pair[3], 0x6420u)},
          {byte_perm(pair[0], pair[1], 0x7531u), byte_perm(pair[2], pair[3], 0x7531u)},
          nan ? 0u : 0x80808080u};
}
// The four elements whose E2M1 codes are the nibbles of quad (bits 0 .. 15) as BF16 pairs: the first two in *first
// (element 0 in the low half), the last two in *second. The magnitudes select table bytes; the sign bits, moved to
// bit 2 of each selector nibble by the shift, select 0x80 or 0x00 (mxfp4_remap_quad's way).
__host__ __device__ inline void nvfp4_values_quad(const Nvfp4BlockValues& t, uint32_t quad, uint32_t* first,
                                                  uint32_t* second) {
  const uint32_t lo = byte_perm(t.lo[0], t.lo[1], quad & 0x7777u);
  const uint32_t hi = byte_perm(t.hi[0], t.hi[1], quad & 0x7777u) ^ byte_perm(0u, t.sign, (quad >> 1) & 0x7777u);
  *first = byte_perm(lo, hi, 0x5140u);
  *second = byte_perm(lo, hi, 0x7362u);
}
// A word of eight packed codes (element k in nibble k) as eight BF16 values, two per output word.
__host__ __device__ inline void nvfp4_values_word(const Nvfp4BlockValues& t, uint32_t codes, uint32_t (&out)[4]) {
  nvfp4_values_quad(t, codes, &out[0], &out[1]);
  nvfp4_values_quad(t, codes >> 16, &out[2], &out[3]);
}

}  // namespace llmc
