// llmc/precision/scale_math.cuh: the scale formulas that the FP8 quantisers (llmc/precision/fp8_quant.cu) and their
// host references (test/reference/quant_ref.cpp) share bit for bit, compiled on both sides: the largest value of a
// format, the scale from an amax (with its margin and power-of-two rounding), a block's scale, where element (r, c)
// finds its scale in a GEMM-ready scale array (llmc/precision/tensor.h), and the valid (non-padding) part of that
// array. FP32 arithmetic goes through llmc/core/float_rn.cuh (correctly rounded on both sides; no fast math).
//
// Scale from an amax:
//   scale = max(format) / amax / 2^margin, computed in FP32 as max / (amax * 2^margin);
//   pow2: scale = pow2_floor(scale);  scale is clamped to [2^-126, FLT_MAX] before that (a tiny amax never gives inf);
//   amax == 0, negative or not finite: the fallback (per-tensor paths keep the previous scale; blocks use 1).
//   scale_inv = 1.0f / scale.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/precision/encoding.h"

namespace llmc {

// The largest finite value of an FP8 format (anything that is not E5M2 counts as E4M3, as the device code reads a
// uint8_t format array).
__host__ __device__ inline float fp8_max_of(ElementFormat f) { return f == ElementFormat::E5M2 ? kE5M2Max : kE4M3Max; }

// fp8max / (amax * margin_factor) in FP32, clamped to [2^-126, FLT_MAX], optionally floored to a power of two;
// `fallback` when amax is 0, negative, NaN or infinite. margin_factor = 2^margin (exact).
__host__ __device__ inline float scale_from_amax(float amax, float fallback, float fp8max, float margin_factor,
                                                 bool pow2) {
  if (!(amax > 0.0f) || (float_to_bits(amax) & 0x7f800000u) == 0x7f800000u) return fallback;
  float s = div_rn(fp8max, mul_rn(amax, margin_factor));
  s = fminf(fmaxf(s, FLT_MIN), FLT_MAX);
  if (pow2) {
#ifdef __CUDA_ARCH__
    s = bits_to_float(float_to_bits(s) & 0x7f800000u);  // s is normal here: zeroing the mantissa is the floor
#else
    s = pow2_floor(s);
#endif
  }
  return s;
}

// A block's scale: its own amax, no margin, 1 for an all-zero or non-finite block.
__host__ __device__ inline float block_scale(float amax, float fp8max, bool pow2) {
  return scale_from_amax(amax, 1.0f, fp8max, 1.0f, pow2);
}

// Whether x, quantised with the multiplier `scale`, is clipped: the one definition of FP8 clipping (the telemetry's
// clipped count). Its scaled value, the FP32 product x * scale the quantiser converts, is beyond the format's largest
// finite value fp8max, or is NaN: the conversion saturates it (a value at fp8max is exact and does not count).
__host__ __device__ inline bool fp8_clipped(float x, float scale, float fp8max) {
  return !(fabsf(mul_rn(x, scale)) <= fp8max);
}

// The multiplier of a block-wise FP8 quantisation (block_scale of the block's amax a) for element x (a BF16 value) of
// a block whose stored scale_inv is si, as fp8_clipped needs it. The scale itself is not stored, and si = 1 / scale
// (FP32) does not determine an FP32 scale; but only an element with |x| = a can be clipped (a smaller BF16 magnitude
// is at most a (1 - 2^-8), and a (1 - 2^-8) * scale is below fp8max), and for it block_scale(|x|) is the block's
// scale, recognised by its reciprocal (the scale of a smaller |x| is at least 2^-8 larger, another reciprocal). So:
// 1 / si for power-of-two scales and for si = 1 (both exact: 1 / scale = 1 only for scale 1, the scale of an all-zero
// or non-finite block), else block_scale(|x|) where its reciprocal is si, else 0 (x is not clipped; a NaN x is
// only in a non-finite block, si = 1).
__host__ __device__ inline float fp8_block_multiplier(float x, float si, float fp8max, bool pow2) {
  if (pow2 || si == 1.0f) return div_rn(1.0f, si);
  const float candidate = block_scale(fabsf(x), fp8max, false);
  return div_rn(1.0f, candidate) == si ? candidate : 0.0f;
}

// Index into a GEMM-ready scale_inv array (leading dimension ld) of element (r, c) of a (rows, cols) source whose
// scales are shared by `block` (tensor.h's layouts: 1 x N runs [kb * ld + r], N x N tiles [rb * ld + cb]).
__host__ __device__ inline size_t scale_index(BlockShape block, int r, int c, int ld) {
  if (block.rows == 1) return static_cast<size_t>(c / block.cols) * ld + r;
  if (block.rows > 1) return static_cast<size_t>(r / block.rows) * ld + c / block.cols;
  return 0;
}

// 2^margin, for margin in [-64, 64] (else llmc::Error naming `who`).
inline float margin_factor(const char* who, int margin) {
  if (margin < -64 || margin > 64) throw_error("%s: margin = %d must be in [-64, 64]", who, margin);
  return std::ldexp(1.0f, margin);
}

// max over the bits of |x| (llmc/core/cuda_utils.cuh's amax_bits, on the host).
inline uint32_t abs_bits_host(float x) { return float_to_bits(x) & 0x7fffffffu; }

// The valid part of a (rows, cols) source's scale_inv array, without the padding entries: entries [i * ld + j],
// i < *scale_rows, j < *scale_cols (none for an empty source).
inline void valid_scale_shape(const Encoding& e, int rows, int cols, int* scale_rows, int* scale_cols) {
  const BlockShape b = e.block;
  if (b.whole_tensor()) {
    *scale_rows = 1, *scale_cols = 1;
  } else if (b.rows == 1) {
    *scale_rows = static_cast<int>(ceil_div(static_cast<size_t>(cols), b.cols)), *scale_cols = rows;  // [kb * ld + r]
  } else {
    *scale_rows = static_cast<int>(ceil_div(static_cast<size_t>(rows), b.rows));                      // [rb * ld + cb]
    *scale_cols = static_cast<int>(ceil_div(static_cast<size_t>(cols), b.cols));
  }
  if (rows == 0) *scale_rows = *scale_cols = 0;
}

// The arguments fp8_delayed_scaling_update (llmc/precision/fp8_quant.h) and its host reference accept; llmc::Error
// naming `who` and the argument otherwise.
inline void check_delayed_scaling_args(const char* who, const void* history, const void* amax, const void* scale,
                                       const void* scale_inv, const void* formats, int count, int len, int pos,
                                       ScaleFormat scales) {
  if (count < 0) throw_error("%s: count = %d must be >= 0", who, count);
  if (len < 1) throw_error("%s: len = %d (the amax history length) must be >= 1", who, len);
  if (pos < 0 || pos >= len) throw_error("%s: pos = %d must be in [0, len = %d)", who, pos, len);
  if (count > 0 && (!history || !amax || !scale || !scale_inv || !formats))
    throw_error("%s: history, amax, scale, scale_inv and formats must all be non-null (count = %d)", who, count);
  if (scales != ScaleFormat::FP32 && scales != ScaleFormat::Pow2FP32)
    throw_error("%s: scales = %s; per-tensor FP8 scales are fp32 or pow2", who, scale_format_name(scales));
}

}  // namespace llmc
