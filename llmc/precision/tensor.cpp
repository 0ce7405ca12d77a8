// llmc/precision/tensor.cpp: names of the scale granularities (config strings), and the sizes of the GEMM-ready
// scale_inv arrays whose layouts llmc/precision/tensor.h documents.
#include "llmc/precision/tensor.h"

#include "llmc/core/common.h"

namespace llmc {

const char* scale_granularity_name(ScaleGranularity g) {
  switch (g) {
    case ScaleGranularity::Tensor: return "tensor";
    case ScaleGranularity::Block1x128: return "1x128";
    case ScaleGranularity::Block128x128: return "128x128";
  }
  return "unknown";
}

bool parse_scale_granularity(const std::string& s, ScaleGranularity* out) {
  if (s == "tensor") {
    *out = ScaleGranularity::Tensor;
    return true;
  }
  if (s == "1x128") {
    *out = ScaleGranularity::Block1x128;
    return true;
  }
  if (s == "128x128") {
    *out = ScaleGranularity::Block128x128;
    return true;
  }
  return false;
}

static void check_shape(const char* what, int rows, int cols) {
  if (rows < 0 || cols < 0) throw_error("%s: rows = %d and cols = %d must be non-negative", what, rows, cols);
}

int scale_inv_ld(ScaleGranularity g, int rows, int cols) {
  check_shape("scale_inv_ld", rows, cols);
  switch (g) {
    case ScaleGranularity::Tensor: return 1;
    case ScaleGranularity::Block1x128: return static_cast<int>(round_up(static_cast<size_t>(rows), 4));
    case ScaleGranularity::Block128x128:
      return static_cast<int>(round_up(ceil_div(static_cast<size_t>(cols), kScaleBlock), 4));
  }
  throw_error("scale_inv_ld: unknown scale granularity %d", static_cast<int>(g));
}

size_t scale_inv_floats(ScaleGranularity g, int rows, int cols) {
  check_shape("scale_inv_floats", rows, cols);
  const size_t ld = static_cast<size_t>(scale_inv_ld(g, rows, cols));
  switch (g) {
    case ScaleGranularity::Tensor: return 1;
    case ScaleGranularity::Block1x128: return ceil_div(static_cast<size_t>(cols), kScaleBlock) * ld;  // (kb, ld)
    case ScaleGranularity::Block128x128: return ceil_div(static_cast<size_t>(rows), kScaleBlock) * ld;  // (rb, ld)
  }
  throw_error("scale_inv_floats: unknown scale granularity %d", static_cast<int>(g));
}

}  // namespace llmc
