// llmc/precision/encoding.cpp: names, parsing, validation and sizes of the encodings of llmc/precision/encoding.h.
#include "llmc/precision/encoding.h"

#include <sstream>
#include <vector>

#include "llmc/core/common.h"

namespace llmc {

const char* scale_format_name(ScaleFormat f) {
  switch (f) {
    case ScaleFormat::FP32: return "fp32";
    case ScaleFormat::Pow2FP32: return "pow2";
    case ScaleFormat::E8M0: return "e8m0";
    case ScaleFormat::E4M3: return "e4m3";
  }
  throw_error("unknown ScaleFormat %d", static_cast<int>(f));
}

bool parse_scale_format(const std::string& s, ScaleFormat* out) {
  return find_by_name(s, kScaleFormats, scale_format_name, out);
}

int scale_format_bytes(ScaleFormat f) {
  return f == ScaleFormat::FP32 || f == ScaleFormat::Pow2FP32 ? 4 : 1;
}

std::string block_shape_name(BlockShape b) {
  if (b.whole_tensor()) return "tensor";
  return std::to_string(b.rows) + "x" + std::to_string(b.cols);
}

bool parse_block_shape(const std::string& s, BlockShape* out) {
  return find_by_name(s, kBlockShapes, block_shape_name, out);
}

namespace {

constexpr const char* kScalesWord = "scales";
constexpr const char* kTensorScaleSuffix = "+ fp32 tensor scale";

}  // namespace

std::string encoding_name(const Encoding& e) {
  std::string s = std::string(element_format_name(e.element)) + " " + block_shape_name(e.block);
  if (e.scale != ScaleFormat::FP32) s += std::string(" ") + scale_format_name(e.scale) + " " + kScalesWord;
  if (e.tensor_scale) s += std::string(" ") + kTensorScaleSuffix;
  return s;
}

bool parse_encoding(const std::string& s, Encoding* out) {
  std::istringstream in(s);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  Encoding e;
  if (words.size() < 2 || !parse_element_format(words[0], &e.element) || !parse_block_shape(words[1], &e.block))
    return false;
  size_t i = 2;
  if (i + 1 < words.size() && words[i + 1] == kScalesWord) {
    if (!parse_scale_format(words[i], &e.scale) || e.scale == ScaleFormat::FP32) return false;
    i += 2;
  }
  std::string rest;
  for (; i < words.size(); i++) rest += (rest.empty() ? "" : " ") + words[i];
  if (!rest.empty()) {
    if (rest != kTensorScaleSuffix) return false;
    e.tensor_scale = true;
  }
  *out = e;
  return true;
}

std::string encoding_error(const Encoding& e) {
  const BlockShape b = e.block;
  const bool row_run = b.rows == 1 && b.cols > 0, tile = b.rows > 1 && b.rows == b.cols;
  if (!b.whole_tensor() && !row_run && !tile)
    return strformat("block %dx%d is neither 1xN nor NxN (N > 0)", b.rows, b.cols);
  if (b.whole_tensor() && e.scale != ScaleFormat::FP32 && e.scale != ScaleFormat::Pow2FP32)
    return strformat("a whole-tensor scale is FP32 (fp32 or pow2), not %s", scale_format_name(e.scale));
  if (b.whole_tensor() && e.tensor_scale)
    return "a second-level tensor scale sits above block scales, and this encoding has one scale for the whole tensor";
  return "";
}

static void check_shape(const char* what, const Encoding& e, int rows, int cols) {
  if (rows < 0 || cols < 0) throw_error("%s: rows = %d and cols = %d must be non-negative", what, rows, cols);
  const std::string why = encoding_error(e);
  if (!why.empty()) throw_error("%s: not an encoding: %s", what, why.c_str());
}

size_t code_bytes(const Encoding& e, int rows, int cols) {
  check_shape("code_bytes", e, rows, cols);
  const size_t row_bits = static_cast<size_t>(cols) * element_format_bits(e.element);
  return static_cast<size_t>(rows) * ceil_div(row_bits, 8);
}

// The layouts of tensor.h: 1 x N blocks (kb, ld = round_up(rows, 4)), N x N tiles (rb, ld = round_up(cb count, 4)).
int scale_inv_ld(const Encoding& e, int rows, int cols) {
  check_shape("scale_inv_ld", e, rows, cols);
  const BlockShape b = e.block;
  if (b.whole_tensor()) return 1;
  if (b.rows == 1) return static_cast<int>(round_up(static_cast<size_t>(rows), 4));
  return static_cast<int>(round_up(ceil_div(static_cast<size_t>(cols), b.cols), 4));
}

size_t scale_inv_count(const Encoding& e, int rows, int cols) {
  const size_t ld = static_cast<size_t>(scale_inv_ld(e, rows, cols));
  const BlockShape b = e.block;
  if (b.whole_tensor()) return 1;
  if (b.rows == 1) return ceil_div(static_cast<size_t>(cols), b.cols) * ld;  // (kb, ld)
  return ceil_div(static_cast<size_t>(rows), b.rows) * ld;                  // (rb, ld)
}

size_t scale_inv_bytes(const Encoding& e, int rows, int cols) {
  return scale_inv_count(e, rows, cols) * scale_format_bytes(e.scale);
}

}  // namespace llmc
