// test/reference/fp4_ref.cpp: the host references of the FP4 quantisers of llmc/precision/fp4_quant.h (declared in
// test/reference/precision_ref.h), written from the definitions, block by block, not from the kernels' thread
// mapping: the same codes, scale codes and tensor scales bit for bit. Round to nearest goes through llmc/core/dtypes'
// e2m1_encode (the bit-level codec checked against ml_dtypes; the kernels use fp4_codec.cuh's threshold form);
// the scale formulas, stochastic rounding, random words and Hadamard transforms are the shared headers'.
#include <algorithm>
#include <cmath>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/core/float_rn.cuh"
#include "llmc/precision/fp4_codec.cuh"
#include "llmc/precision/fp4_quant.h"
#include "llmc/precision/fp4_rng.cuh"
#include "llmc/precision/hadamard.cuh"
#include "llmc/precision/scale_math.cuh"
#include "test/reference/precision_ref.h"

namespace llmc {

namespace {

uint32_t amax_bits_of(const float* v, int n) {
  uint32_t m = 0;
  for (int i = 0; i < n; i++) m = std::max(m, abs_bits_host(v[i]));
  return m;
}

struct BlockScale {
  uint8_t code;
  float multiplier;
};

BlockScale amax_scale(bool nvfp4, float block_amax, float s_enc) {
  if (nvfp4) {
    const uint8_t c = nvfp4_block_scale_code(block_amax, s_enc);
    return {c, nvfp4_element_multiplier(c, s_enc)};
  }
  const uint8_t c = mxfp4_scale_code(block_amax);
  return {c, mxfp4_element_multiplier(c)};
}

// The scale of a 1xN block of len values: the amax rule, or for MXFP4 QuEST's Gaussian rule or Quartet's range-matched
// one (the amax rule's code, the elements' multiplier times 3/4).
BlockScale scale_of(bool nvfp4, const float* block, int len, const QuantizeArgs& args, float s_enc) {
  const uint32_t amax_bits = amax_bits_of(block, len);
  if (!nvfp4 && args.mxfp4_scale == Mxfp4Scale::Gaussian) {
    if (len != kGaussianBlock) throw_error("fp4_quantize_cpu: Gaussian scales take whole blocks of 32");
    const uint8_t c = mxfp4_gaussian_scale_code(block, amax_bits);
    return {c, mxfp4_element_multiplier(c)};
  }
  const BlockScale s = amax_scale(nvfp4, bits_to_float(amax_bits), s_enc);
  if (!nvfp4 && args.mxfp4_scale == Mxfp4Scale::RangeMatched) return {s.code, mxfp4_range_matched_multiplier(s.code)};
  return s;
}

uint8_t round_one(float v, float multiplier, const QuantizeArgs& args, uint64_t index, int copy) {
  if (multiplier == 0.0f) return 0;
  const float y = mul_rn(v, multiplier);
  if (args.rounding == Rounding::Stochastic) return e2m1_sr(y, random_bits16(args.sr_key, index, copy));
  return e2m1_encode(y);
}

void put_code(uint8_t* codes, int out_cols, int r, int c, uint8_t code) {
  uint8_t& byte = codes[static_cast<size_t>(r) * ((out_cols + 1) / 2) + c / 2];
  byte = (c & 1) ? e2m1_pack(e2m1_unpack(byte, 0), code) : e2m1_pack(code, e2m1_unpack(byte, 1));
}

// One copy of a 1xN encoding: src (out_rows, out_cols) row-major (x itself, or x transposed), optionally rotated.
void quantize_runs(uint8_t* codes, uint8_t* scales, float* tensor_scale_inv, uint32_t* trust_mask,
                   const std::vector<float>& src, int out_rows, int out_cols, const Encoding& e,
                   const QuantizeArgs& args, bool rotate, float source_amax, int copy) {
  const bool nvfp4 = nvfp4_encoding(e);
  const int n = e.block.cols, ld = scale_inv_ld(e, out_rows, out_cols);
  std::vector<float> v = src;
  if (rotate) hadamard_cpu(v.data(), v.size(), args.hadamard.size, args.hadamard.signs);  // rows are multiples of size
  float tensor_amax = source_amax;
  if (rotate) tensor_amax = bits_to_float(amax_bits_of(v.data(), static_cast<int>(v.size())));
  const float s_enc = nvfp4 ? nvfp4_tensor_encode_scale(tensor_amax) : 1.0f;
  if (nvfp4) *tensor_scale_inv = 1.0f / s_enc;
  std::fill(scales, scales + scale_inv_bytes(e, out_rows, out_cols), nvfp4 ? kE4M3One : kE8M0One);
  std::fill(codes, codes + code_bytes(e, out_rows, out_cols), 0);
  for (int r = 0; r < out_rows; r++)
    for (int c0 = 0; c0 < out_cols; c0 += n) {
      const int len = std::min(n, out_cols - c0);
      const float* block = v.data() + static_cast<size_t>(r) * out_cols + c0;
      const BlockScale s = scale_of(nvfp4, block, len, args, s_enc);
      scales[static_cast<size_t>(c0 / n) * ld + r] = s.code;
      if (trust_mask) {
        uint32_t trusted = 0;
        for (int i = 0; i < len; i++)
          if (e2m1_trusted(block[i], s.multiplier)) trusted |= 1u << i;
        trust_mask[static_cast<size_t>(r) * ceil_div(out_cols, n) + c0 / n] = trusted;
      }
      for (int i = 0; i < len; i++)
        put_code(codes, out_cols, r, c0 + i,
                 round_one(block[i], s.multiplier, args, static_cast<uint64_t>(r) * out_cols + c0 + i, copy));
    }
}

}  // namespace

void hadamard_cpu(float* v, size_t n, int size, uint32_t signs) {
  if (size != 16 && size != 32) throw_error("hadamard_cpu: size = %d must be 16 or 32", size);
  if (n % size != 0) throw_error("hadamard_cpu: n = %zu is not a multiple of size = %d", n, size);
  for (size_t i = 0; i < n; i += size) hadamard_transform_n(v + i, size, signs);
}

void fp4_quantize_cpu(Fp4CpuOut* out, const float* x, int rows, int cols, const Encoding& e, const QuantizeArgs& args,
                      const float* tensor_amax) {
  const char* who = "fp4_quantize_cpu";
  if (!fp4_encoding(e)) throw_error("%s: %s is not an FP4 encoding", who, encoding_name(e).c_str());
  if (rows < 0 || cols < 0) throw_error("%s: rows = %d, cols = %d must be >= 0", who, rows, cols);
  const size_t count = static_cast<size_t>(rows) * cols;
  const float source_amax = tensor_amax ? *tensor_amax : bits_to_float(amax_bits_of(x, static_cast<int>(count)));
  if (e.block == kBlock16x16) {
    const float s_enc = nvfp4_tensor_encode_scale(source_amax);
    const int rbs = static_cast<int>(ceil_div(rows, 16)), cbs = static_cast<int>(ceil_div(cols, 16));
    const int ld = scale_inv_ld(e, rows, cols), ld_t = scale_inv_ld(e, cols, rows);
    if (out->data) {
      std::fill(out->scale_inv, out->scale_inv + scale_inv_bytes(e, rows, cols), kE4M3One);
      std::fill(out->data, out->data + code_bytes(e, rows, cols), 0);
      out->tensor_scale_inv = 1.0f / s_enc;
    }
    if (out->data_t) {
      std::fill(out->scale_inv_t, out->scale_inv_t + scale_inv_bytes(e, cols, rows), kE4M3One);
      std::fill(out->data_t, out->data_t + code_bytes(e, cols, rows), 0);
      out->tensor_scale_inv_t = 1.0f / s_enc;
    }
    for (int rb = 0; rb < rbs; rb++)
      for (int cb = 0; cb < cbs; cb++) {
        const int r_end = std::min(rows, 16 * rb + 16), c_end = std::min(cols, 16 * cb + 16);
        uint32_t m = 0;
        for (int r = 16 * rb; r < r_end; r++)
          for (int c = 16 * cb; c < c_end; c++) m = std::max(m, abs_bits_host(x[static_cast<size_t>(r) * cols + c]));
        const BlockScale s = amax_scale(true, bits_to_float(m), s_enc);
        if (out->data) out->scale_inv[static_cast<size_t>(rb) * ld + cb] = s.code;
        if (out->data_t) out->scale_inv_t[static_cast<size_t>(cb) * ld_t + rb] = s.code;
        for (int r = 16 * rb; r < r_end; r++)
          for (int c = 16 * cb; c < c_end; c++) {
            const size_t i = static_cast<size_t>(r) * cols + c;
            const uint8_t code = round_one(x[i], s.multiplier, args, i, 0);
            if (out->data) put_code(out->data, cols, r, c, code);
            if (out->data_t) put_code(out->data_t, rows, c, r, code);
          }
      }
    return;
  }
  const bool h = args.hadamard.any();
  if (out->data) {
    std::vector<float> src(x, x + count);
    quantize_runs(out->data, out->scale_inv, &out->tensor_scale_inv, out->trust_mask, src, rows, cols, e, args,
                  h && args.hadamard.data, source_amax, 0);
  }
  if (out->data_t) {
    std::vector<float> src_t(count);
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) src_t[static_cast<size_t>(c) * rows + r] = x[static_cast<size_t>(r) * cols + c];
    quantize_runs(out->data_t, out->scale_inv_t, &out->tensor_scale_inv_t, nullptr, src_t, cols, rows, e, args,
                  h && args.hadamard.data_t, source_amax, 1);
  }
}

QuantStats fp4_quant_stats_cpu(const float* x, const uint8_t* codes, const uint8_t* scale_inv, float tensor_scale_inv,
                               int rows, int cols, const Encoding& e, const QuantizeArgs& args) {
  const char* who = "fp4_quant_stats_cpu";
  if (!fp4_encoding(e)) throw_error("%s: %s is not an FP4 encoding", who, encoding_name(e).c_str());
  const bool nvfp4 = nvfp4_encoding(e);
  const size_t count = static_cast<size_t>(rows) * cols;
  std::vector<float> v(x, x + count);  // the values the quantiser saw
  if (args.hadamard.any() && args.hadamard.data) hadamard_cpu(v.data(), count, args.hadamard.size, args.hadamard.signs);
  const float s_enc =
      nvfp4 ? nvfp4_tensor_encode_scale(bits_to_float(amax_bits_of(v.data(), static_cast<int>(count)))) : 1.0f;
  // Each element's multiplier from its block's values, as fp4_quantize_cpu scales them.
  std::vector<float> multiplier(count);
  if (e.block == kBlock16x16) {
    for (int rb = 0; rb < rows; rb += 16)
      for (int cb = 0; cb < cols; cb += 16) {
        const int r_end = std::min(rows, rb + 16), c_end = std::min(cols, cb + 16);
        uint32_t m = 0;
        for (int r = rb; r < r_end; r++)
          for (int c = cb; c < c_end; c++) m = std::max(m, abs_bits_host(v[static_cast<size_t>(r) * cols + c]));
        const float mult = amax_scale(true, bits_to_float(m), s_enc).multiplier;
        for (int r = rb; r < r_end; r++)
          for (int c = cb; c < c_end; c++) multiplier[static_cast<size_t>(r) * cols + c] = mult;
      }
  } else {
    const int n = e.block.cols;
    for (int r = 0; r < rows; r++)
      for (int c0 = 0; c0 < cols; c0 += n) {
        const int len = std::min(n, cols - c0);
        const size_t i0 = static_cast<size_t>(r) * cols + c0;
        const float mult = scale_of(nvfp4, v.data() + i0, len, args, s_enc).multiplier;
        std::fill(multiplier.begin() + i0, multiplier.begin() + i0 + len, mult);
      }
  }
  std::vector<float> deq(count);
  fp4_dequantize_cpu(deq.data(), codes, scale_inv, tensor_scale_inv, rows, cols, e);
  const bool range_matched = !nvfp4 && args.mxfp4_scale == Mxfp4Scale::RangeMatched;
  double s[kQuantStatsSlots] = {};
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      const uint8_t code = e2m1_unpack(codes[static_cast<size_t>(r) * ((cols + 1) / 2) + c / 2], c) & 0x7;
      const double err = static_cast<double>(v[i]) - fp4_represented_value(deq[i], range_matched);
      s[kStatSaturated] += code == 0x7;
      s[kStatUnderflow] += v[i] != 0.0f && code == 0;
      s[kStatNonzero] += v[i] != 0.0f;
      s[kStatSumX2] += static_cast<double>(v[i]) * v[i];
      s[kStatSumErr2] += err * err;
      s[kStatClipped] += e2m1_clipped(v[i], multiplier[i]);
    }
  // the smallest scale: 1 / the largest decode scale of a real block (times the tensor scale_inv for NVFP4)
  int scale_rows = 0, scale_cols = 0;
  valid_scale_shape(e, rows, cols, &scale_rows, &scale_cols);
  const int ld = scale_inv_ld(e, rows, cols);
  uint32_t max_scale = 0;
  for (int i = 0; i < scale_rows; i++)
    for (int j = 0; j < scale_cols; j++) {
      const uint8_t code = scale_inv[static_cast<size_t>(i) * ld + j];
      const float decode = nvfp4 ? mul_rn(fp8_decode(code, ElementFormat::E4M3), tensor_scale_inv) : e8m0_decode(code);
      max_scale = std::max(max_scale, abs_bits_host(decode));
    }
  s[kStatAmax] = bits_to_float(amax_bits_of(v.data(), static_cast<int>(count)));
  s[kStatScale] = 1.0 / static_cast<double>(bits_to_float(max_scale));
  s[kStatElements] = static_cast<double>(count);
  return finish_quant_stats(s);
}

void fp4_dequantize_cpu(float* out, const uint8_t* codes, const uint8_t* scale_inv, float tensor_scale_inv, int rows,
                        int cols, const Encoding& e) {
  if (!fp4_encoding(e)) throw_error("fp4_dequantize_cpu: %s is not an FP4 encoding", encoding_name(e).c_str());
  const bool nvfp4 = nvfp4_encoding(e);
  const int ld = scale_inv_ld(e, rows, cols);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const uint8_t code = e2m1_unpack(codes[static_cast<size_t>(r) * ((cols + 1) / 2) + c / 2], c);
      const uint8_t s = scale_inv[scale_index(e.block, r, c, ld)];
      out[static_cast<size_t>(r) * cols + c] =
          nvfp4 ? mul_rn(mul_rn(e2m1_decode(code), fp8_decode(s, ElementFormat::E4M3)), tensor_scale_inv)
                : mul_rn(e2m1_decode(code), e8m0_decode(s));
    }
}

}  // namespace llmc
