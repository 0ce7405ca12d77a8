// llmc/precision/tensor.h: what a quantised tensor is. A QTensor carries its encoding (llmc/precision/encoding.h), its
// codes, the scales that turn them back into numbers, the amax of the source it was quantised from, and (where a
// Hopper TN GEMM needs it) a transposed copy with that copy's own scales. Device pointers; the owner
// (llmc/precision/linear) allocates them with the sizes encoding.h gives.
//
// Scaling convention (as Transformer Engine): q = quant(x * scale) and x ~= q * scale_inv, scale_inv = 1 / scale.
// GEMMs take scale_inv. FP8 conversions saturate to +-max and round to nearest even.
//
// Scale layouts ("GEMM-ready": what cuBLASLt reads for CUBLASLT_MATMUL_MATRIX_SCALE_*), for a source (rows, cols)
// quantised along cols (the GEMM's K dimension is the contiguous one, cols), blocks of N elements:
//   whole tensor  scale (1), scale_inv (1); the transposed copy data_t shares them.
//   1 x N         one scale per row and N consecutive columns: scale_inv[kb * ld + r], kb < ceil(cols / N),
//                 r < rows, ld = round_up(rows, 4); padding entries are 1. (1x128: cuBLASLt VEC128_32F)
//                 The transposed copy data_t (cols, rows) is quantised from the BF16 source along rows (N x 1
//                 blocks of the source): scale_inv_t[rb * ld_t + c], rb < ceil(rows / N), ld_t = round_up(cols, 4).
//   N x N         one scale per N x N tile: scale_inv[rb * ld + cb], rb < ceil(rows / N), cb < ceil(cols / N),
//                 ld = round_up(ceil(cols / N), 4). (128x128: cuBLASLt BLK128x128_32F)
//                 The transposed copy uses the same tiles: scale_inv_t[cb * ld_t + rb],
//                 ld_t = round_up(ceil(rows / N), 4).
// A partial block at the edge (rows or cols not a multiple of N) is scaled from the elements it has.
//
// FP4 (E2M1 codes, llmc/precision/fp4_quant.h): codes are packed two per byte, element c of a row in byte c / 2, the
// even element in the low nibble (llmc/core/dtypes' e2m1_pack); every row of data (rows, cols) and of data_t
// (cols, rows) starts on a byte (code_bytes), an odd row's last high nibble is 0. The block scales use the layouts
// above with one byte per entry (scale_inv / scale_inv_t then point at scale_inv_bytes bytes of E4M3 or E8M0 codes:
// reinterpret them as uint8_t; padding entries are the code of 1.0). These are llm8's own layouts for its own FP4
// GEMMs on Hopper, not the swizzled 128x4 scale tiles of Blackwell's block-scaled cuBLASLt GEMMs. An encoding with a
// second-level tensor scale (NVFP4) keeps the FP32 decode scale of each copy in tensor_scale_inv (data) and
// tensor_scale_inv_t (data_t): value = e2m1 * block scale * tensor_scale_inv (llmc/precision/fp4_codec.cuh); the two
// differ when only one copy is rotated (a Hadamard transform changes the amax).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "llmc/precision/encoding.h"

namespace llmc {

struct QTensor {
  int rows = 0, cols = 0;                  // shape of the source (rows, cols), row-major
  Encoding encoding;
  uint8_t* data = nullptr;                 // (rows, cols) codes (code_bytes), or null when this copy is not kept
  uint8_t* data_t = nullptr;               // (cols, rows) transposed codes, or null
  float* scale = nullptr;                  // whole tensor: (1) quantisation multiplier; blocks: unused
  float* scale_inv = nullptr;              // whole tensor: (1); blocks: scale_inv_count(encoding, rows, cols), above
  float* scale_inv_t = nullptr;            // blocks: scale_inv_count(encoding, cols, rows) for data_t; else unused
  float* amax = nullptr;                   // (1) max |x| of the source at the last quantisation (may be null)
  float* tensor_scale_inv = nullptr;       // second-level scale (encoding.tensor_scale): (1) data's FP32 decode scale
  float* tensor_scale_inv_t = nullptr;     //   and (1) data_t's
  // NVFP4 1x16 only, optional: a copy's decoded values without the tensor scale (e2m1 * block scale, exact in BF16),
  // (rows, cols) / (cols, rows) row-major, written by the quantiser beside or instead of its codes (the copy is kept
  // when either is set; its block and tensor scales are written either way). A product that consumes the copy at once
  // reads them and expands nothing (llmc/precision/fp4_gemm.h).
  __nv_bfloat16* values = nullptr;
  __nv_bfloat16* values_t = nullptr;
};

}  // namespace llmc
