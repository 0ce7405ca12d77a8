// llmc/precision/tensor.h: what a quantised tensor is. A QTensor carries its FP8 codes, the scales that turn them back into
// numbers, the amax of the source it was quantised from, and (where a Hopper TN GEMM needs it) a transposed copy
// with that copy's own scales. Device pointers; the owner (llmc/precision/linear) allocates them with the sizes given here.
//
// Scaling convention (as Transformer Engine): q = fp8(x * scale) and x ~= q * scale_inv, scale_inv = 1 / scale.
// GEMMs take scale_inv. Conversions saturate to +-fp8_max and round to nearest even.
//
// Scale layouts ("GEMM-ready": what cuBLASLt reads for CUBLASLT_MATMUL_MATRIX_SCALE_*), for a source (rows, cols)
// quantised along cols (the GEMM's K dimension is the contiguous one, cols):
//   Tensor        scale (1), scale_inv (1); the transposed copy data_t shares them.
//   Block1x128    one scale per row and 128 consecutive columns: scale_inv[kb * ld + r], kb < ceil(cols / 128),
//                 r < rows, ld = round_up(rows, 4); padding entries are 1. (cuBLASLt VEC128_32F)
//                 The transposed copy data_t (cols, rows) is quantised from the BF16 source along rows (128 x 1
//                 blocks of the source): scale_inv_t[rb * ld_t + c], rb < ceil(rows / 128), ld_t = round_up(cols, 4).
//   Block128x128  one scale per 128 x 128 tile: scale_inv[rb * ld + cb], rb < ceil(rows / 128),
//                 cb < ceil(cols / 128), ld = round_up(ceil(cols / 128), 4). (cuBLASLt BLK128x128_32F)
//                 The transposed copy uses the same tiles: scale_inv_t[cb * ld_t + rb], ld_t = round_up(ceil(rows / 128), 4).
// A partial block at the edge (rows or cols not a multiple of 128) is scaled from the elements it has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "llmc/core/dtypes.h"

namespace llmc {

enum class ScaleGranularity : uint8_t { Tensor, Block1x128, Block128x128 };

const char* scale_granularity_name(ScaleGranularity g);    // "tensor" | "1x128" | "128x128"
bool parse_scale_granularity(const std::string& s, ScaleGranularity* out);

constexpr int kScaleBlock = 128;

// Floats of the GEMM-ready scale_inv array of a (rows, cols) source quantised along cols at granularity g
// (Tensor: 1). For the transposed copy of a Block1x128 or Block128x128 tensor call it with (cols, rows).
size_t scale_inv_floats(ScaleGranularity g, int rows, int cols);
// Leading dimension of that array (see the layouts above; Tensor: 1).
int scale_inv_ld(ScaleGranularity g, int rows, int cols);

struct QTensor {
  int rows = 0, cols = 0;                  // shape of the source (rows, cols), row-major
  Fp8Format format = Fp8Format::E4M3;
  ScaleGranularity granularity = ScaleGranularity::Tensor;
  uint8_t* data = nullptr;                 // (rows, cols) FP8 codes, or null when this copy is not kept
  uint8_t* data_t = nullptr;               // (cols, rows) transposed FP8 codes, or null
  float* scale = nullptr;                  // Tensor: (1) quantisation multiplier; blocks: unused
  float* scale_inv = nullptr;              // Tensor: (1); blocks: scale_inv_floats(g, rows, cols), layout above
  float* scale_inv_t = nullptr;            // blocks: scale_inv_floats(g, cols, rows) for data_t; Tensor: unused
  float* amax = nullptr;                   // (1) max |x| of the source at the last quantisation (may be null)
};

}  // namespace llmc
