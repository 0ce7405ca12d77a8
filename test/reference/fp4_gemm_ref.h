// test/reference/fp4_gemm_ref.h: the CPU references of the FP4 products of llmc/precision/gemm.h and their operand
// conversions (llmc/precision/fp4_gemm.h), in the test-side library llmc_reference (fp4_gemm_ref.cpp): the exact
// value of every FP4 element, the dequantise-and-multiply GEMM in FP64 that every FP4 product is checked against, and
// the MXFP4 -> E4M3 remap and NVFP4 -> BF16 expansion written from their definitions with the host codecs of
// llmc/core/dtypes.h (not from llmc/precision/fp4_remap.cuh, which the kernels use). Layouts: llmc/precision/tensor.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "llmc/precision/encoding.h"

namespace llmc {

// An FP4 operand (rows, K) on the host: packed E2M1 codes, one-byte block scale codes (GEMM-ready layout), the NVFP4
// FP32 tensor decode scale (unused for MXFP4).
struct Fp4CpuOperand {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  float tensor_scale_inv = 1.0f;
  Encoding encoding;
  int rows = 0, K = 0;
};

// out (rows, K): the exact value of every element, e2m1 * block scale [* tensor scale] in FP64 (exact: at most
// 2 + 4 + 24 significant bits); NaN in a block with the NaN scale code.
void fp4_values_cpu(double* out, const Fp4CpuOperand& a);

// The reference of D (M, N) = A (M, K) · B (N, K)ᵀ over the exact values, rows m0 <= m < m1 of D only:
// D[(m - m0) * N + n] = sum_k a[m,k] b[n,k] in FP64 (k in order), absref[...] = sum_k |a[m,k] b[n,k]|.
void fp4_matmul_cpu(double* D, double* absref, const Fp4CpuOperand& A, const Fp4CpuOperand& B, int m0, int m1);

// The MXFP4 -> E4M3 remap of src (rows, K) from its definition: per row and 128-column run, the outer exponent
// R = max floor(log2 |v|) - 8 over the run's nonzero finite values v (0 for none), codes = E4M3 round to nearest even
// of v * 2^-R (the host codec; the NaN code for NaN values), zero for columns >= K; codes (rows, Kp = round_up(K, 128)),
// scale_inv the floats 2^R in the 1x128 layout (ld = round_up(rows, 4), padding 1). Returns the number of src's
// 32-element blocks with an element whose code times 2^R is not exactly its value.
uint64_t mxfp4_to_e4m3_cpu(uint8_t* codes, float* scale_inv, const Fp4CpuOperand& src);

// The NVFP4 -> BF16 expansion of src (rows, K): bf16 bits of e2m1 * block scale (no tensor scale), zero for columns
// >= K; out (rows, Kp = round_up(K, 8)).
void nvfp4_to_bf16_cpu(uint16_t* out, const Fp4CpuOperand& src);

}  // namespace llmc
