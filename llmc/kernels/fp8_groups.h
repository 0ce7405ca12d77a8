// llmc/kernels/fp8_groups.h: the FP8 1x16 group copy of an activation (COAT's FP8 precision flow: the inputs that the
// non-linear layers save for backward, kept as E4M3 with one E8M0 scale per 16 channels). The producers (RMSNorm /
// LayerNorm forward and their fused residual adds, SwiGLU / GELU forward) write it where they already read the
// tensor; the backward kernels read it instead of the BF16 tensor (llmc/kernels/fp8_groups.cuh has the device codec).
// The precision layer's view of the same bytes (a QTensor of encoding e4m3 1x16, its standalone quantiser,
// dequantiser and sizes) is llmc/precision/group_quant.h.
//
// A (rows, cols) BF16 tensor x, cols a multiple of 16, becomes
//   codes      (rows, cols) E4M3 bytes, row-major:           codes[r * cols + c] = e4m3(x[r, c] * q[r, c / 16])
//   scale_inv  (ceil(cols / 16), ld) E8M0 codes of the dequant scales (one byte each; an E8M0 code is the exponent
//              field of a power of two, 2^(code - 127)):
//                                                        x[r, c] ~= e4m3_value(code) * 2^(scale_inv[(c / 16) * ld + r] - 127)
//              ld = round_up(rows, 4); the padding entries (rows <= r < ld) hold 127, the code of 1 (the 1 x N layout
//              of llmc/precision/tensor.h, so a QTensor describes these bytes)
//   group_amax (optional, FP32, the layout of scale_inv; padding 0): a = max |x| of each group, Group Scaling's record
//              from which the per-tensor amax follows without another pass over x (fp8_groups_tensor_amax)
// e4m3() rounds to nearest even and saturates to +-448 (cvt.rn.satfinite); a NaN becomes the NaN code 0x7F.
//
// The scale of a group, from its amax a (fp8_group_scale_code, shared by the kernels and the CPU reference):
//   a finite, > 0:  2^k, k = max(ceil(log2(a / 448)), -126): the smallest power of two that puts a at or below 448, so
//                   the group's largest value codes in (224, 448]. k comes exactly from a's bits (a = m 2^E with
//                   1 <= m < 2: k = E - 8, or E - 7 when m > 1.75). The quantisation multiplier 2^-k and the dequant
//                   scale 2^k are normal FP32 numbers, so x * 2^-k and code * 2^k are exact products.
//   a = 0:          k = 0 (the codes are +-0).
//   a inf or NaN:   E8M0's NaN code 0xFF, multiplier 1: every value of the group dequantises to NaN, so a
//                   non-finite activation gives non-finite gradients in backward (as the BF16 tensor would) and the
//                   step's non-finite check sees it.
// One byte per 16 codes (MXFP8's power-of-two scales, in COAT's 1 x 16 groups): a copy is 1.0625 bytes per element
// where an FP32 scale made it 1.25. What a power of two costs: the group maximum lands in (224, 448] instead of on
// 448, so the values of a group keep E4M3's 3 mantissa bits (relative error 2^-4) as before and only those more than
// about 2^13.8 (instead of 2^14.8) below the group maximum fall into E4M3's subnormals, one binade earlier.
#pragma once

#include <cfloat>
#include <cstdint>

#include "llmc/core/float_rn.cuh"
#include "llmc/kernels/conventions.h"

namespace llmc {

constexpr int kFp8GroupSize = 16;       // channels per group (COAT's 1 x 16)
constexpr float kFp8GroupMax = 448.0f;  // E4M3's largest finite value
constexpr int kFp8GroupMinExp = -126;   // the smallest scale exponent k: 2^k and 2^-k stay normal FP32 numbers
constexpr uint8_t kFp8GroupScaleOne = 127;   // the E8M0 code of 1: all-zero groups and the padding entries
constexpr uint8_t kFp8GroupScaleNan = 0xFF;  // E8M0's NaN code: a group with an inf or a NaN

// Leading dimension of the scale arrays of a copy of `rows` rows.
__host__ __device__ inline int fp8_groups_ld(int rows) { return (rows + 3) / 4 * 4; }

// The E8M0 code of a group's scale from its amax (bits of max |x|: a NaN's bits exceed +inf's).
__host__ __device__ inline uint8_t fp8_group_scale_code(float amax) {
  const uint32_t bits = float_to_bits(amax) & 0x7fffffffu;
  if (bits >= 0x7f800000u) return kFp8GroupScaleNan;
  if (bits == 0) return kFp8GroupScaleOne;
  // a = m 2^E: a / 448 = (m / 1.75) 2^(E - 8), and m / 1.75 lies in [4 / 7, 1] for m <= 1.75 (mantissa field
  // <= 0x600000), in (1, 8 / 7) above. A subnormal a (exponent field 0) is far below the clamp.
  const int exponent = static_cast<int>(bits >> 23) - 127;
  int k = exponent - 8 + ((bits & 0x7fffffu) > 0x600000u ? 1 : 0);
  if (k < kFp8GroupMinExp) k = kFp8GroupMinExp;
  return static_cast<uint8_t>(k + 127);
}
// The dequant scale 2^(code - 127) (NaN for the NaN code) and the quantisation multiplier 2^(127 - code) (1 for the NaN
// code) of a code fp8_group_scale_code gives (1 <= code <= 253, or the NaN code).
__host__ __device__ inline float fp8_group_scale_value(uint8_t code) {
  return code == kFp8GroupScaleNan ? bits_to_float(0x7fc00000u) : bits_to_float(static_cast<uint32_t>(code) << 23);
}
__host__ __device__ inline float fp8_group_multiplier(uint8_t code) {
  return code == kFp8GroupScaleNan ? 1.0f : bits_to_float(static_cast<uint32_t>(254 - code) << 23);
}

// Where a producer writes the copy of its saved input (all null: no copy; codes and scale_inv 16-byte / 4-byte
// aligned device pointers with the sizes above; group_amax 4-byte aligned).
struct Fp8GroupsOut {
  uint8_t* codes = nullptr;
  uint8_t* scale_inv = nullptr;  // E8M0 codes
  float* group_amax = nullptr;   // optional
  bool wanted() const { return codes != nullptr; }
};

// A copy as the backward kernels read it.
struct Fp8Groups {
  const uint8_t* codes = nullptr;
  const uint8_t* scale_inv = nullptr;  // E8M0 codes
};

}  // namespace llmc
