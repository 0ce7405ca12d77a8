// test/reference/quant_ref.cpp: the host references of the FP8 quantisers of llmc/precision/fp8_quant.h (declared in
// test/reference/precision_ref.h), written from the definitions, not from the kernels' tiling: the same codes, scales
// and amax bit for bit, through the scale formulas the kernels use (llmc/precision/scale_math.cuh) and the host FP8
// codec (llmc/core/dtypes.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/precision/scale_math.cuh"
#include "test/reference/precision_ref.h"

namespace llmc {

namespace {

void check_cast_cpu(const char* who, int rows, int cols, ElementFormat f) {
  if (rows < 0) throw_error("%s: rows = %d must be >= 0", who, rows);
  if (cols <= 0 || cols % 16 != 0) throw_error("%s: cols = %d must be a positive multiple of 16", who, cols);
  if (!is_fp8(f)) throw_error("%s: %s is not an FP8 element format", who, element_format_name(f));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Scales
float fp8_scale_from_amax_cpu(float amax, float previous_scale, const Encoding& e, int margin) {
  if (!is_fp8(e.element)) throw_error("fp8_scale_from_amax_cpu: %s is not an FP8 encoding", encoding_name(e).c_str());
  return scale_from_amax(amax, previous_scale, fp8_max_of(e.element), margin_factor("fp8_scale_from_amax_cpu", margin),
                         e.pow2_scales());
}

void fp8_delayed_scaling_update_cpu(float* history, float* amax, float* scale, float* scale_inv,
                                    const uint8_t* formats, int count, int len, int pos, bool use_max, int margin,
                                    ScaleFormat scales) {
  const char* who = "fp8_delayed_scaling_update_cpu";
  const float mf = margin_factor(who, margin);
  check_delayed_scaling_args(who, history, amax, scale, scale_inv, formats, count, len, pos, scales);
  const bool pow2 = scales == ScaleFormat::Pow2FP32;
  for (int i = 0; i < count; i++) {
    if (!is_fp8(static_cast<ElementFormat>(formats[i])))
      throw_error("%s: formats[%d] = %d is not an FP8 element format", who, i, formats[i]);
    float* h = history + static_cast<size_t>(i) * len;
    const float a = amax[i];
    h[pos] = a;
    float m = a;
    if (use_max) {
      m = 0.0f;
      for (int k = 0; k < len; k++) m = std::fmax(m, h[k]);
    }
    scale[i] = scale_from_amax(m, scale[i], fp8_max_of(static_cast<ElementFormat>(formats[i])), mf, pow2);
    scale_inv[i] = 1.0f / scale[i];
    amax[i] = 0.0f;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Casts
float amax_bf16_cpu(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) m = std::max(m, abs_bits_host(x[i]));
  return bits_to_float(m);
}

void fp8_quantize_tensorwise_cpu(uint8_t* data, uint8_t* data_t, float* amax_out, const float* x, int rows, int cols,
                                 float scale, ElementFormat f) {
  check_cast_cpu("fp8_quantize_tensorwise_cpu", rows, cols, f);
  uint32_t m = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const float v = x[static_cast<size_t>(r) * cols + c];
      const uint8_t code = fp8_encode(mul_rn(v, scale), f);
      if (data) data[static_cast<size_t>(r) * cols + c] = code;
      if (data_t) data_t[static_cast<size_t>(c) * rows + r] = code;
      m = std::max(m, abs_bits_host(v));
    }
  if (amax_out) *amax_out = bits_to_float(std::max(float_to_bits(*amax_out), m));  // as atomicMax on the bits
}

void fp8_quantize_blockwise_cpu(uint8_t* data, float* scale_inv, uint8_t* data_t, float* scale_inv_t, const float* x,
                                int rows, int cols, const Encoding& e) {
  const char* who = "fp8_quantize_blockwise_cpu";
  check_cast_cpu(who, rows, cols, e.element);
  if (e.block != kBlock1x128 && e.block != kBlock128x128)
    throw_error("%s: the encoding %s has no 1x128 or 128x128 blocks", who, encoding_name(e).c_str());
  const ElementFormat f = e.element;
  const bool pow2 = e.pow2_scales();
  const int n = e.block.cols;  // 128: the block length along a row, and the tile side
  const float fmax = fp8_max_of(f);
  const int rbs = static_cast<int>(ceil_div(static_cast<size_t>(rows), n));
  const int cbs = static_cast<int>(ceil_div(static_cast<size_t>(cols), n));
  const int ld = scale_inv_ld(e, rows, cols), ld_t = scale_inv_ld(e, cols, rows);
  if (scale_inv) std::fill(scale_inv, scale_inv + scale_inv_count(e, rows, cols), 1.0f);
  if (scale_inv_t) std::fill(scale_inv_t, scale_inv_t + scale_inv_count(e, cols, rows), 1.0f);
  auto X = [&](int r, int c) { return x[static_cast<size_t>(r) * cols + c]; };

  if (e.block == kBlock1x128) {
    if (data)  // 1 x 128 blocks along the rows of x
      for (int r = 0; r < rows; r++)
        for (int cb = 0; cb < cbs; cb++) {
          const int c_end = std::min(cols, (cb + 1) * n);
          uint32_t m = 0;
          for (int c = cb * n; c < c_end; c++) m = std::max(m, abs_bits_host(X(r, c)));
          const float s = block_scale(bits_to_float(m), fmax, pow2);
          for (int c = cb * n; c < c_end; c++)
            data[static_cast<size_t>(r) * cols + c] = fp8_encode(mul_rn(X(r, c), s), f);
          if (scale_inv) scale_inv[static_cast<size_t>(cb) * ld + r] = 1.0f / s;
        }
    if (data_t)  // 128 x 1 blocks along the columns of x, written transposed
      for (int c = 0; c < cols; c++)
        for (int rb = 0; rb < rbs; rb++) {
          const int r_end = std::min(rows, (rb + 1) * n);
          uint32_t m = 0;
          for (int r = rb * n; r < r_end; r++) m = std::max(m, abs_bits_host(X(r, c)));
          const float s = block_scale(bits_to_float(m), fmax, pow2);
          for (int r = rb * n; r < r_end; r++)
            data_t[static_cast<size_t>(c) * rows + r] = fp8_encode(mul_rn(X(r, c), s), f);
          if (scale_inv_t) scale_inv_t[static_cast<size_t>(rb) * ld_t + c] = 1.0f / s;
        }
    return;
  }
  for (int rb = 0; rb < rbs; rb++)  // 128 x 128 tiles; data_t is the transposed codes with the same scales
    for (int cb = 0; cb < cbs; cb++) {
      const int r_end = std::min(rows, (rb + 1) * n), c_end = std::min(cols, (cb + 1) * n);
      uint32_t m = 0;
      for (int r = rb * n; r < r_end; r++)
        for (int c = cb * n; c < c_end; c++) m = std::max(m, abs_bits_host(X(r, c)));
      const float s = block_scale(bits_to_float(m), fmax, pow2);
      for (int r = rb * n; r < r_end; r++)
        for (int c = cb * n; c < c_end; c++) {
          const uint8_t code = fp8_encode(mul_rn(X(r, c), s), f);
          if (data) data[static_cast<size_t>(r) * cols + c] = code;
          if (data_t) data_t[static_cast<size_t>(c) * rows + r] = code;
        }
      if (data && scale_inv) scale_inv[static_cast<size_t>(rb) * ld + cb] = 1.0f / s;
      if (data_t && scale_inv_t) scale_inv_t[static_cast<size_t>(cb) * ld_t + rb] = 1.0f / s;
    }
}

void fp8_transpose_codes_cpu(uint8_t* dst, const uint8_t* src, int rows, int cols) {
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) dst[static_cast<size_t>(c) * rows + r] = src[static_cast<size_t>(r) * cols + c];
}

// ---------------------------------------------------------------------------------------------------------------
// Dequantisation and telemetry
void fp8_dequantize_cpu(float* out, const uint8_t* data, const float* scale_inv, int rows, int cols,
                        const Encoding& e) {
  if (rows < 0 || cols < 0) throw_error("fp8_dequantize_cpu: rows = %d, cols = %d must be >= 0", rows, cols);
  const int ld = scale_inv_ld(e, rows, cols);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      out[i] = mul_rn(fp8_decode(data[i], e.element), scale_inv[scale_index(e.block, r, c, ld)]);
    }
}

QuantStats fp8_quant_stats_cpu(const float* x, const uint8_t* data, const float* scale_inv, int rows, int cols,
                               const Encoding& e, float scale) {
  check_cast_cpu("fp8_quant_stats_cpu", rows, cols, e.element);
  const ElementFormat f = e.element;
  const float fmax = fp8_max_of(f);
  const uint8_t max_code = f == ElementFormat::E4M3 ? 0x7E : 0x7B;
  const int ld = scale_inv_ld(e, rows, cols);
  // The multiplier of each element's block, from the definition: the given scale for the whole tensor, else
  // block_scale of the block's amax (the cast's formula; the scale array's index is the block's).
  std::vector<uint32_t> block_amax(e.block.whole_tensor() ? 0 : scale_inv_count(e, rows, cols), 0);
  for (int r = 0; r < rows && !e.block.whole_tensor(); r++)
    for (int c = 0; c < cols; c++) {
      uint32_t& m = block_amax[scale_index(e.block, r, c, ld)];
      m = std::max(m, abs_bits_host(x[static_cast<size_t>(r) * cols + c]));
    }
  double s[kQuantStatsSlots] = {};
  uint32_t amax = 0, max_si = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      const size_t b = scale_index(e.block, r, c, ld);
      const float xf = x[i];
      const uint8_t code = data[i];
      const float deq = mul_rn(fp8_decode(code, f), scale_inv[b]);
      const double err = static_cast<double>(xf) - static_cast<double>(deq);
      const float multiplier =
          e.block.whole_tensor() ? scale : block_scale(bits_to_float(block_amax[b]), fmax, e.pow2_scales());
      s[kStatSaturated] += (code & 0x7f) == max_code;
      s[kStatUnderflow] += xf != 0.0f && (code & 0x7f) == 0;
      s[kStatNonzero] += xf != 0.0f;
      s[kStatSumX2] += static_cast<double>(xf) * xf;
      s[kStatSumErr2] += err * err;
      s[kStatClipped] += fp8_clipped(xf, multiplier, fmax);
      amax = std::max(amax, abs_bits_host(xf));
    }
  int scale_rows = 0, scale_cols = 0;
  valid_scale_shape(e, rows, cols, &scale_rows, &scale_cols);
  for (int i = 0; i < scale_rows; i++)
    for (int j = 0; j < scale_cols; j++)
      max_si = std::max(max_si, abs_bits_host(scale_inv[static_cast<size_t>(i) * ld + j]));
  s[kStatAmax] = bits_to_float(amax);
  s[kStatScale] = 1.0 / static_cast<double>(bits_to_float(max_si));
  s[kStatElements] = static_cast<double>(rows) * cols;
  return finish_quant_stats(s);
}

}  // namespace llmc
