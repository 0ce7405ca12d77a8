// llmc/precision/encoding.h: the description of how a quantised tensor is encoded, one value for every format the
// precision layer knows: the element format of its codes (llmc/core/dtypes.h: E4M3, E5M2, E2M1 packed two per byte),
// which elements share a scale (the whole tensor, 1 x N runs along a row, N x N tiles), how the scales are stored
// (FP32, FP32 rounded down to a power of two, E8M0, E4M3) and whether a second-level FP32 tensor scale sits above
// the block scales. From it follow the sizes of a (rows, cols) tensor's codes and GEMM-ready scale arrays (layouts:
// llmc/precision/tensor.h), its name in logs, and its parsing and validation. Whether a quantiser or a GEMM exists
// for an encoding is the business of llmc/precision/quantize.h and llmc/precision/gemm.h. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "llmc/core/dtypes.h"

namespace llmc {

// How the scales are stored. Pow2FP32: FP32 values rounded down to a power of two (exact in any later product).
enum class ScaleFormat : uint8_t { FP32, Pow2FP32, E8M0, E4M3 };
constexpr ScaleFormat kScaleFormats[] = {ScaleFormat::FP32, ScaleFormat::Pow2FP32, ScaleFormat::E8M0,
                                         ScaleFormat::E4M3};
const char* scale_format_name(ScaleFormat f);  // "fp32" | "pow2" | "e8m0" | "e4m3"
bool parse_scale_format(const std::string& s, ScaleFormat* out);  // false (out untouched) for an unknown name
int scale_format_bytes(ScaleFormat f);         // 4, 4, 1, 1

// The elements that share one scale: the whole tensor (0 x 0), a run of N consecutive elements of a row (1 x N: the
// row is the GEMM's K dimension), or an N x N tile.
struct BlockShape {
  int rows = 0, cols = 0;
  bool whole_tensor() const { return rows == 0 && cols == 0; }
};
inline bool operator==(BlockShape a, BlockShape b) { return a.rows == b.rows && a.cols == b.cols; }
inline bool operator!=(BlockShape a, BlockShape b) { return !(a == b); }
constexpr BlockShape kWholeTensor{0, 0};
constexpr BlockShape kBlock1x128{1, 128};    // DeepSeek-V3 activations and gradients (cuBLASLt VEC128_32F)
constexpr BlockShape kBlock128x128{128, 128};  // DeepSeek-V3 weights (cuBLASLt BLK128x128_32F)
constexpr BlockShape kBlock1x16{1, 16};      // NVFP4; COAT's activation groups
constexpr BlockShape kBlock1x32{1, 32};      // MXFP4
constexpr BlockShape kBlock16x16{16, 16};    // NVFP4 weights
// The shapes with a name (parse_block_shape reads only these).
constexpr BlockShape kBlockShapes[] = {kWholeTensor, kBlock1x128, kBlock128x128, kBlock1x16, kBlock1x32, kBlock16x16};
std::string block_shape_name(BlockShape b);  // "tensor" | "1x128" | "128x128" | "1x16" | ...
bool parse_block_shape(const std::string& s, BlockShape* out);  // false (out untouched) for an unknown name

struct Encoding {
  ElementFormat element = ElementFormat::E4M3;
  BlockShape block = kWholeTensor;
  ScaleFormat scale = ScaleFormat::FP32;
  bool tensor_scale = false;  // a second-level FP32 scale of the whole tensor above the block scales (NVFP4)

  bool per_tensor() const { return block.whole_tensor(); }
  bool pow2_scales() const { return scale == ScaleFormat::Pow2FP32; }
};
inline bool operator==(const Encoding& a, const Encoding& b) {
  return a.element == b.element && a.block == b.block && a.scale == b.scale && a.tensor_scale == b.tensor_scale;
}
inline bool operator!=(const Encoding& a, const Encoding& b) { return !(a == b); }

// For logs and errors: "<element> <block>[ <scale> scales][ + fp32 tensor scale]", the scale part left out for FP32
// scales: "e4m3 tensor", "e4m3 1x128 pow2 scales", "e2m1 1x16 e4m3 scales + fp32 tensor scale".
std::string encoding_name(const Encoding& e);
// The inverse of encoding_name; false (out untouched) when s is not such a name.
bool parse_encoding(const std::string& s, Encoding* out);
// Empty when e describes an encoding at all, else why not: a block that is neither 1 x N nor N x N, a whole-tensor
// scale that is not FP32, a second-level tensor scale without block scales. (Whether this build can quantise it is
// quantizer_error's question, llmc/precision/quantize.h.)
std::string encoding_error(const Encoding& e);

// Sizes of a (rows, cols) source (rows, cols >= 0, else llmc::Error), quantised along cols:
//   code_bytes      bytes of its codes: rows * ceil(cols * bits / 8) (packed formats start every row on a byte)
//   scale_inv_ld    leading dimension of its GEMM-ready scale array (whole tensor: 1)
//   scale_inv_count entries of that array, padding included (whole tensor: 1; a second-level tensor scale is not
//                   counted here)
//   scale_inv_bytes scale_inv_count * scale_format_bytes
// For the transposed copy of a block-scaled tensor call them with (cols, rows). The layouts are tensor.h's.
size_t code_bytes(const Encoding& e, int rows, int cols);
int scale_inv_ld(const Encoding& e, int rows, int cols);
size_t scale_inv_count(const Encoding& e, int rows, int cols);
size_t scale_inv_bytes(const Encoding& e, int rows, int cols);

}  // namespace llmc
