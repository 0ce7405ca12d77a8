// llmc/precision/fp4_gemm.h: the operand conversions that run FP4 products exactly on Hopper, which has no FP4 tensor
// cores: MXFP4 operands re-encoded as E4M3 codes with a power-of-two outer scale per (row, 128 columns) for the FP8
// tensor cores, NVFP4 operands expanded into BF16 for the BF16 tensor cores. matmul_quant (llmc/precision/gemm.h)
// picks them from the operands' encodings and runs the GEMM on their outputs; tests and telemetry may call them
// directly. The element rules and why they are exact: llmc/precision/fp4_remap.cuh. CPU references:
// test/reference/fp4_gemm_ref.h.
//
// An operand is src (rows, K): packed E2M1 codes and one-byte block scale codes in the layouts of
// llmc/precision/tensor.h (quant_operand of an FP4 QTensor gives them), K along the rows. An NVFP4 operand may
// instead bring the BF16 values nvfp4_to_bf16 would give (QuantOperand::values, written by the quantiser for the
// copies a product consumes at once): the product reads them and converts nothing.
//
// Why these mappings:
//   MXFP4. The outer scales are cuBLASLt's VEC128_32F block scales on both operands (1x128 * 1x128, a pair Hopper
//     runs and the fp8_blockwise wgrad already uses): A's per-row scale and B's per-output-column scale are both
//     per-row scales of a (rows, K) operand, so no 128x128 tiles and no epilogue column scaling are needed, and each
//     128-column run gets its own power of two, which keeps strictly more blocks exact than one scale per row (an
//     element is lost only when its own run spans more than 17 binades). The scales multiply FP32 partial sums of
//     exact E4M3 products by powers of two: exact while the results stay normal FP32 numbers. OUTER_VEC_32F (one
//     scale per row / column) would be coarser and is not documented for Hopper.
//   NVFP4. e2m1 * E4M3 scale needs up to 6 significant bits (fp4_remap.cuh), more than E4M3's 4 (of the 7 x 126
//     products of nonzero E2M1 magnitudes and positive finite E4M3 scales, 63 exceed 448 and 212 of the other 819
//     are not E4M3 values: test_fp4_gemm_ref), so the FP8 tensor cores cannot take it without rounding; BF16 holds it
//     exactly. The FP32 tensor scales stay out of the operands (folding one into a BF16 element would round it) and
//     enter once as alpha = fl(sa * sb): D = alpha * sum(a b) differs from the exact sa * sb * sum(a b) by two FP32
//     roundings, as on Blackwell, where the NVFP4 GEMM applies the global scales in its epilogue too. Exact while
//     alpha is a normal FP32 number (the two tensors' amax product above about 2688^2 * 2^-126, 8.5e-32).
//
// How the products report their numbers (benchmarks): a product is timed as the whole matmul_quant call (conversions
// plus GEMM) and as the conversions alone, both on the same GPU as our own BF16 and FP8 GEMMs of the same logical
// shape; throughput counts 2 M N K of the logical shape (never the padded K); each row names its route
// ("mxfp4 -> e4m3 fp8" or "nvfp4 -> bf16"), the scratch bytes (quant_gemm_scratch_bytes) and the inexact-block count.
// Nothing here is FP4 arithmetic speed: Hopper has none.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/precision/gemm.h"

namespace llmc {

// The columns of the converted copies: K zero-padded to whole 128-column outer-scale runs (E4M3, the K of cuBLASLt's
// VEC128_32F scales) or to 16-byte BF16 rows.
constexpr int kE4m3RemapColumns = 128;
constexpr int kBf16ExpandColumns = 8;
int mxfp4_remap_cols(int K);   // round_up(K, 128)
int nvfp4_expand_cols(int K);  // round_up(K, 8)

// src encoded MXFP4 (rows, K) -> codes (rows, Kp = mxfp4_remap_cols(K)) E4M3 row-major, elements >= K zero, and
// scale_inv, the FP32 outer scales 2^R in the GEMM-ready 1x128 layout of an (rows, Kp) tensor (scale_inv[j * ld + r],
// ld = round_up(rows, 4), padding rows 1.0), so that codes * scale_inv is src's value wherever the remap is exact.
// R per (row, 128 columns) as fp4_remap.cuh says. *inexact_blocks (device) is increased by the number of src's
// 32-element blocks holding an element the remap could not keep exactly (rounded or flushed to zero, fp4_remap.cuh
// says to what); a block counts once. rows, K >= 1; codes 16-byte aligned.
void mxfp4_to_e4m3(uint8_t* codes, float* scale_inv, unsigned long long* inexact_blocks, const QuantOperand& src,
                   int rows, int K, cudaStream_t stream);

// src encoded NVFP4 (1x16 or 16x16 blocks) (rows, K) -> out (rows, Kp = nvfp4_expand_cols(K)) BF16 row-major,
// e2m1 * block scale, exact (fp4_remap.cuh), elements >= K zero. The FP32 tensor scale is not applied: the product
// takes it as its alpha (nvfp4_gemm_alpha). rows, K >= 1; out 16-byte aligned.
void nvfp4_to_bf16(bf16* out, const QuantOperand& src, int rows, int K, cudaStream_t stream);

// alpha_beta[0] = *a_tensor_scale_inv * *b_tensor_scale_inv (one FP32 rounding), alpha_beta[1] = beta: the device
// scalars of the expanded NVFP4 product D = alpha * A·Bᵀ + beta * D.
void nvfp4_gemm_alpha(float* alpha_beta, const float* a_tensor_scale_inv, const float* b_tensor_scale_inv, float beta,
                      cudaStream_t stream);

}  // namespace llmc
