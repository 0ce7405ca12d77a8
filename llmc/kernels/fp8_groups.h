// llmc/kernels/fp8_groups.h: the FP8 1x16 group copy of an activation (COAT's FP8 precision flow: the inputs that the
// non-linear layers save for backward, kept as E4M3 with one FP32 scale per 16 channels). The producers (RMSNorm /
// LayerNorm forward and their fused residual adds, SwiGLU / GELU forward) write it where they already read the
// tensor; the backward kernels read it instead of the BF16 tensor (llmc/kernels/fp8_groups.cuh has the device codec).
// The precision layer's view of the same bytes (a QTensor of encoding e4m3 1x16, its standalone quantiser,
// dequantiser and sizes) is llmc/precision/group_quant.h.
//
// A (rows, cols) BF16 tensor x, cols a multiple of 16, becomes
//   codes      (rows, cols) E4M3 bytes, row-major:           codes[r * cols + c] = e4m3(x[r, c] * q[r, c / 16])
//   scale_inv  (ceil(cols / 16), ld) FP32 dequant scales:    x[r, c] ~= e4m3_value(code) * scale_inv[(c / 16) * ld + r]
//              ld = round_up(rows, 4); the padding entries (rows <= r < ld) hold 1 (the 1 x N layout of
//              llmc/precision/tensor.h, so a QTensor describes these bytes)
//   group_amax (optional, the layout of scale_inv; padding 0): a = max |x| of each group, Group Scaling's record from
//              which the per-tensor amax follows without another pass over x (fp8_groups_tensor_amax)
// e4m3() rounds to nearest even and saturates to +-448 (cvt.rn.satfinite); a NaN becomes the NaN code 0x7F.
//
// The scales of a group, from its amax a (fp8_group_scales, shared by the kernels and the CPU reference):
//   a finite, > 0:  d = a' / 448 and q = 448 / a', a' = max(a, 2^-117), each one correctly rounded FP32 division.
//                   (The clamp keeps both d and q normal FP32 numbers; a group entirely below 2^-117 ~ 6e-36 keeps
//                   its values to E4M3 precision relative to 2^-117.)
//   a = 0:          d = 1, q = 1 (the codes are +-0).
//   a inf or NaN:   d = NaN, q = 1: every value of the group dequantises to NaN, so a non-finite activation gives
//                   non-finite gradients in backward (as the BF16 tensor would) and the step's non-finite check
//                   sees it.
// FP32 scales rather than powers of two: COAT's (group amax / 448). The error is E4M3's rounding of x * q (relative
// 2^-4 for normal codes) either way; an FP32 scale puts the group maximum on 448 (the whole top binade is used, where a
// power of two leaves up to half of it unused and pushes the small values of the group one binade closer to E4M3's
// subnormals), and nothing downstream needs the exactness of a power of two: the scale is never a GEMM operand, the
// backward kernels multiply by it in FP32.
#pragma once

#include <cfloat>
#include <cstdint>

#include "llmc/core/float_rn.cuh"
#include "llmc/kernels/conventions.h"

namespace llmc {

constexpr int kFp8GroupSize = 16;           // channels per group (COAT's 1 x 16)
constexpr float kFp8GroupMax = 448.0f;       // E4M3's largest finite value
constexpr float kFp8GroupMinAmax = 0x1p-117f;  // a' = max(a, this): d = a' / 448 stays a normal FP32 number

// Leading dimension of the scale arrays of a copy of `rows` rows.
__host__ __device__ inline int fp8_groups_ld(int rows) { return (rows + 3) / 4 * 4; }

// The scales of one group from its amax (bits of max |x|: a NaN's bits exceed +inf's). *d: the dequant scale that is
// stored; *q: the multiplier of the cast.
__host__ __device__ inline void fp8_group_scales(float amax, float* d, float* q) {
  const uint32_t bits = float_to_bits(amax) & 0x7fffffffu;
  if (bits >= 0x7f800000u) {  // inf or NaN in the group
    *d = bits_to_float(0x7fc00000u);
    *q = 1.0f;
  } else if (bits == 0) {
    *d = 1.0f;
    *q = 1.0f;
  } else {
    const float a = amax < kFp8GroupMinAmax ? kFp8GroupMinAmax : amax;
    *d = div_rn(a, kFp8GroupMax);
    *q = div_rn(kFp8GroupMax, a);
  }
}

// Where a producer writes the copy of its saved input (all null: no copy; codes and scale_inv 16-byte / 4-byte
// aligned device pointers with the sizes above).
struct Fp8GroupsOut {
  uint8_t* codes = nullptr;
  float* scale_inv = nullptr;
  float* group_amax = nullptr;  // optional
  bool wanted() const { return codes != nullptr; }
};

// A copy as the backward kernels read it.
struct Fp8Groups {
  const uint8_t* codes = nullptr;
  const float* scale_inv = nullptr;
};

}  // namespace llmc
