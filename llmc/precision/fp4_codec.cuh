// llmc/precision/fp4_codec.cuh: the FP4 arithmetic that the quantisers of llmc/precision/fp4_quant.cu and their host
// references (test/reference/fp4_ref.cpp) share bit for bit, compiled on both sides: E2M1 rounding (to nearest even,
// and stochastic), the E4M3 and E8M0 scale codes, and the scale formulas of NVFP4 and MXFP4. FP32 arithmetic goes
// through llmc/core/float_rn.cuh (correctly rounded on both sides; no fast math).
//
// E2M1 (OCP FP4, values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, code S.EE.M):
//   e2m1_rn: round to nearest, ties to even, saturating at 6 (the code of |x| in [2^E, 2^(E+1)) is 2 + 2E + the
//     mantissa bit): for |x| >= 1 the FP32 bits rounded to one mantissa bit (adding 0x1FFFFF plus the kept bit sends a
//     tie to the even mantissa) hold (E + 127) << 1 | m from bit 22, so the code is that minus 252, capped at 7; below
//     1 the grid is 0, 0.5, 1 and the code is rint(2 |x|), the low bits of 2 |x| + 2^23 (one fused multiply-add: the
//     product is exact, so it is one rounding at unit spacing). NaN -> kE2M1NanCode as llmc/core/dtypes' e2m1_encode,
//     which it equals on every float (test/precision/test_fp4_ref: a sweep of every 331st float and the ties;
//     test_fp4_quant: on the GPU).
//   e2m1_sr(x, r): stochastic rounding with 16 random bits u (the low half of r): |x| >= 6 -> 6; otherwise lo = the
//     grid value at or below |x|, g the grid step there (0.5 below 2, 1 below 4, 2 above), f = (|x| - lo) / g in
//     [0, 1) (exact in FP32: g is a power of two and |x| - lo is exact), and the result is lo + g when
//     u < floor(f * 2^16), else lo: the rounding of adding u * 2^-16 * g to |x| and truncating to the grid. So
//     P(up) = floor(f * 2^16) / 2^16, in (f - 2^-16, f]; E[result] = |x| exactly when f has at most 16 fractional
//     bits and otherwise lies below |x| (towards zero) by less than g * 2^-16. The sign is x's. NaN -> kE2M1NanCode.
//     (Blackwell's cvt.rs of four FP32 values to E2M1 takes one 32-bit random operand for the four: 16 bits per
//     element is not fewer than that instruction can use.)
//
// NVFP4 (reference doc fp4_recipes.md §3, NVIDIA arXiv 2509.25149 App. B, as Transformer Engine's NVFP4 quantiser),
// for a tensor (or one copy of it) with amax A and a block with amax a_b:
//   tensor (second-level) encode scale  s_enc = 2688 / A   (2688 = 6 * 448; FP32 division; 1 when A is 0 or not
//                                                          finite; clamped to FLT_MAX), its inverse 1 / s_enc is the
//                                                          FP32 tensor scale_inv the GEMM applies;
//   block decode scale                  s_b = e4m3(a_b / 6 * s_enc)   (FP32: (a_b / 6) then * s_enc, then E4M3 round
//                                                          to nearest even, saturating at 448); a non-finite a_b gives
//                                                          the E4M3 NaN code 0x7F;
//   element multiplier                  m_b = min(s_enc / float(s_b), FLT_MAX)   (FP32; 0 when s_b is 0 or NaN: that
//                                                          block's codes are 0; the clamp, as Transformer Engine's,
//                                                          acts only when A < 6 * 448 * 2^9 / FLT_MAX and s_b < 1,
//                                                          where an infinite m_b would turn 0 into NaN and x into 6)
//   code                                e2m1(x * m_b)   (FP32 product, then RTN or SR; saturates at +-6)
//   value                               e2m1 * s_b / s_enc, computed as (e2m1 * s_b) * (1 / s_enc).
// MXFP4 (OCP Microscaling Formats v1.0 §6.3, the variant of the MX spec itself; Quartet's backward range matching
// (elements x 3/4) is a recipe option on top, not this encoding): a block with amax a_b has the shared exponent
// X = floor(log2(a_b)) - 2 (2 = emax of E2M1), clamped to [-127, 127] and stored as the E8M0 code X + 127;
// element code e2m1(x * 2^-X) (an exact scaling); value e2m1 * 2^X. Blocks whose amax is not at least 4 * 2^X lose
// nothing to saturation; a block amax in (6, 8) * 2^X saturates to 6 * 2^X (the MX spec's known clip). An all-zero
// block gets code 127 (scale 1); a block with a non-finite element gets the E8M0 NaN code 0xFF (its codes are 0).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"

namespace llmc {

// --------------------------------------------------------------------------------------------------------------
// E2M1
__host__ __device__ inline uint8_t e2m1_sign(float x) { return static_cast<uint8_t>((float_to_bits(x) >> 31) << 3); }

__host__ __device__ inline uint8_t e2m1_rn(float x) {
  const uint32_t b = float_to_bits(x) & 0x7FFFFFFFu;  // |x|
  const uint32_t upper = ((b + 0x1FFFFFu + ((b >> 22) & 1u)) >> 22) - 252u;  // 2 for 1, 7 for 6, more above
  const uint32_t m = b < 0x3F800000u ? float_to_bits(fma_rn(bits_to_float(b), 2.0f, 8388608.0f)) - 0x4B000000u
                                     : (upper < 7u ? upper : 7u);  // 6 and above, NaN: 7
  return static_cast<uint8_t>((b <= 0x7F800000u ? e2m1_sign(x) : 0u) | m);  // NaN -> kE2M1NanCode
}

__host__ __device__ inline uint8_t e2m1_sr(float x, uint32_t random) {
  // X, a fixed-point number whose high half is lo's code and whose low half is floor(f * 2^16): for |x| >= 1 the
  // FP32 bits from bit 6 (the binade and the kept mantissa bit, from bit 16, are lo's code plus 252; below them the
  // 16 mantissa bits after the kept one); below 1 the grid step is 0.5 and X = floor(|x| * 2^17) (an exact product,
  // truncated): lo's code 0 below 0.5, 1 in [0.5, 1). Rounding up is u < floor(f * 2^16), u the 16 random bits.
  const uint32_t b = float_to_bits(x) & 0x7FFFFFFFu;  // |x|
  const uint32_t X = b >= 0x3F800000u ? (b >> 6) - (252u << 16) : floor_to_uint(mul_rn(bits_to_float(b), 131072.0f));
  const uint32_t m = b >= 0x40C00000u ? 7u : (X >> 16) + ((random & 0xFFFFu) < (X & 0xFFFFu));  // 6 and above, NaN
  return static_cast<uint8_t>((b <= 0x7F800000u ? e2m1_sign(x) : 0u) | m);  // NaN -> kE2M1NanCode
}

// Element `index` of a packed pair (dtypes.h's e2m1_unpack, for device code): the even element in the low nibble.
__host__ __device__ inline uint8_t e2m1_nibble(uint8_t byte, int index) {
  return static_cast<uint8_t>((byte >> (4 * (index & 1))) & 0xFu);
}

__host__ __device__ inline float e2m1_value(uint8_t code) {
  const int m = code & 0x7;
  // 0 .. 1.5 ; 2, 3, 4
  const float v = m < 4 ? 0.5f * static_cast<float>(m) : m == 7 ? 6.0f : static_cast<float>(m - 2);
  return (code & 0x8) ? -v : v;
}

// --------------------------------------------------------------------------------------------------------------
// Scale codes
constexpr uint8_t kE4M3One = 0x38;   // 1.0 in E4M3: the scale of padding entries
constexpr uint8_t kE8M0One = 127;    // 1.0 in E8M0

__host__ __device__ inline uint8_t e4m3_rn(float x) {  // saturating, round to nearest even (dtypes' fp8_encode)
#ifdef __CUDA_ARCH__
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
#else
  return fp8_encode(x, ElementFormat::E4M3);
#endif
}
__host__ __device__ inline float e4m3_value(uint8_t code) {
#ifdef __CUDA_ARCH__
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));  // exact
#else
  return fp8_decode(code, ElementFormat::E4M3);
#endif
}
__host__ __device__ inline float e8m0_value(uint8_t code) {
  if (code == kE8M0NanCode) return bits_to_float(0x7fc00000u);
  return code == 0 ? bits_to_float(0x00400000u) : bits_to_float(static_cast<uint32_t>(code) << 23);  // 2^(code-127)
}

// --------------------------------------------------------------------------------------------------------------
// NVFP4
constexpr float kNvfp4TensorScaleNumerator = 6.0f * 448.0f;  // max(E2M1) * max(E4M3)

__host__ __device__ inline bool finite_positive(float a) {
  return a > 0.0f && (float_to_bits(a) & 0x7f800000u) != 0x7f800000u;
}
__host__ __device__ inline float nvfp4_tensor_encode_scale(float amax) {
  if (!finite_positive(amax)) return 1.0f;
  return fminf(div_rn(kNvfp4TensorScaleNumerator, amax), FLT_MAX);
}
__host__ __device__ inline uint8_t nvfp4_block_scale_code(float block_amax, float s_enc) {
  if ((float_to_bits(block_amax) & 0x7f800000u) == 0x7f800000u) return 0x7F;  // inf or NaN in the block
  return e4m3_rn(mul_rn(div_rn(block_amax, 6.0f), s_enc));
}
__host__ __device__ inline float nvfp4_element_multiplier(uint8_t block_code, float s_enc) {
  const float s_b = e4m3_value(block_code);
  if (!(s_b > 0.0f)) return 0.0f;  // zero or NaN
  return fminf(div_rn(s_enc, s_b), FLT_MAX);  // as s_enc: finite, so that a zero element stays zero
}

// --------------------------------------------------------------------------------------------------------------
// MXFP4
__host__ __device__ inline uint8_t mxfp4_scale_code(float block_amax) {
  const uint32_t bits = float_to_bits(block_amax) & 0x7fffffffu;
  if (bits >= 0x7f800000u) return kE8M0NanCode;
  if (bits == 0) return kE8M0One;
  // floor(log2(a)) = exponent field - 127 for a normal a; code = that - 2 + 127, at least 0 (subnormals included)
  const int exponent_field = static_cast<int>(bits >> 23);
  return static_cast<uint8_t>(exponent_field > 2 ? exponent_field - 2 : 0);
}
// QuEST's Gaussian block scale (Quartet's forward; arXiv 2502.05003 and 2505.14669): for a block of 32 values v (after
// the Hadamard transform) with FP32 sums s1 = sum v_i and s2 = sum v_i * v_i taken in order i = 0 .. 31 from 0,
// mean = s1 / 32, var = s2 / 32 - mean * mean, sigma = sqrt(var) (1 when var is negative by rounding), scale =
// kQuestClipPerSigma * sigma + 1e-8 (every operation FP32, rounded to nearest even) and the E8M0 code
// floor(log2(scale)) + 127: elements beyond 2.92 sigma (rounded down to a power of two) clip at +-6. The largest code
// 254 when scale is not finite (squares beyond FLT_MAX); the NaN code for a block with a non-finite element
// (block_amax_bits: the max over the bits of |v_i|), whose codes are 0. A block of equal values has sigma 0 and clips.
constexpr int kGaussianBlock = 32;
constexpr float kQuestClipPerSigma = 2.92247856f / 6.0f;  // QuEST's MSE-optimal Gaussian clip over max(E2M1)
__host__ __device__ inline uint8_t mxfp4_gaussian_scale_code(const float* v, uint32_t block_amax_bits) {
  if (block_amax_bits >= 0x7f800000u) return kE8M0NanCode;
  float s1 = 0.0f, s2 = 0.0f;
  for (int i = 0; i < kGaussianBlock; i++) {
    s1 = add_rn(s1, v[i]);
    s2 = add_rn(s2, mul_rn(v[i], v[i]));
  }
  const float mean = div_rn(s1, 32.0f), mean_square = div_rn(s2, 32.0f);
  const float var = add_rn(mean_square, -mul_rn(mean, mean));
  const float sigma = var >= 0.0f ? sqrt_rn(var) : 1.0f;
  const uint32_t bits = float_to_bits(add_rn(mul_rn(kQuestClipPerSigma, sigma), 1e-8f));  // >= 1e-8: normal
  return static_cast<uint8_t>(bits >= 0x7f800000u ? 254u : bits >> 23);
}
// Whether element v of a block with element multiplier m is clipped, the one definition of FP4 clipping (the
// telemetry's clipped count, QuEST's trust mask): its scaled value, the FP32 product v * m the quantiser rounds, is
// not below max(E2M1) = 6, or is NaN. 6 itself counts (the trust mask's boundary: the mask keeps |v * m| < 6 only);
// so does a NaN v, and an infinite v in a zeroed block (m = 0: inf * 0 is NaN); the finite elements of a zeroed block
// (scaled to 0) do not.
__host__ __device__ inline bool e2m1_clipped(float v, float multiplier) {
  return !(fabsf(mul_rn(v, multiplier)) < kE2M1Max);
}
// Whether element v of a block with element multiplier m keeps its value's range (QuEST's trust mask): not clipped,
// and not in a zeroed block (m = 0: the NaN scale code's block, whose codes are all 0).
__host__ __device__ inline bool e2m1_trusted(float v, float multiplier) {
  return multiplier != 0.0f && !e2m1_clipped(v, multiplier);
}
// 2^-X = 2^(127 - code) for the element codes (exact; 0 for the NaN code; code 254, 2^-127, is never produced)
__host__ __device__ inline float mxfp4_element_multiplier(uint8_t code) {
  if (code == kE8M0NanCode) return 0.0f;
  return code == 254 ? bits_to_float(0x00400000u) : bits_to_float(static_cast<uint32_t>(254 - code) << 23);
}
// Quartet's range-matched MXFP4 scale (its backward; arXiv 2505.14669 Alg. 1, reference doc fp4_recipes.md §1): the
// amax rule's E8M0 code X + 127 (mxfp4_scale_code), and the element multiplier kRangeMatchFactor * 2^-X (exact: 3/4
// times a power of two, a subnormal at worst), so the element code is e2m1(x * (3/4 * 2^-X)), one FP32 product
// rounded to nearest even. The block amax then lands in [3, 6) * 2^X: nothing clips. The codes and scale decode as
// usual to e2m1 * 2^X, which is 3/4 of the value they stand for: a product of two range-matched operands is
// kRangeMatchProductFactor (16/9) times the product of their decoded values (the consumer applies it).
constexpr float kRangeMatchFactor = 0.75f;
constexpr float kRangeMatchProductFactor = 16.0f / 9.0f;  // FP32 nearest to 16/9
__host__ __device__ inline float mxfp4_range_matched_multiplier(uint8_t code) {
  return mul_rn(mxfp4_element_multiplier(code), kRangeMatchFactor);
}
// The value an FP4 element stands for, from its decoded value (code times the block's decode scale, and for NVFP4 the
// tensor's): range-matched MXFP4 codes stand for 4/3 of it, every other code for itself. In double (one IEEE
// division: the same on host and device), for the telemetry's error sums.
__host__ __device__ inline double fp4_represented_value(float decoded, bool range_matched) {
  return range_matched ? static_cast<double>(decoded) / static_cast<double>(kRangeMatchFactor) : decoded;
}

}  // namespace llmc
