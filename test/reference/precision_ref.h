// test/reference/precision_ref.h: the CPU references of llmc/precision: the FP8 quantisers of
// llmc/precision/fp8_quant.h, bit for bit (the same codes, scales and amax: the kernels' scale formulas,
// llmc/precision/scale_math.cuh, and the host FP8 codec of llmc/core/dtypes.h; quant_ref.cpp), the FP4 quantisers of
// llmc/precision/fp4_quant.h, bit for bit (fp4_ref.cpp: the host E2M1 codec of dtypes.h, the formulas of
// llmc/precision/fp4_codec.cuh, hadamard.cuh and fp4_rng.cuh), and the GEMMs of
// llmc/precision/gemm.h in FP64 (gemm_ref.cpp). They live in the test-side library llmc_reference, never in the
// trainer. Encodings are those of llmc/precision/encoding.h, layouts those of llmc/precision/tensor.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "llmc/precision/encoding.h"
#include "llmc/precision/quantize.h"

namespace llmc {

// -----------------------------------------------------------------------------------------------------------------
// Scales (fp8_scale_from_amax, fp8_delayed_scaling_update)
// The scale from amax with e's format maximum and power-of-two rounding; previous_scale when amax is 0 or not finite.
float fp8_scale_from_amax_cpu(float amax, float previous_scale, const Encoding& e, int margin);
void fp8_delayed_scaling_update_cpu(float* history, float* amax, float* scale, float* scale_inv,
                                    const uint8_t* formats, int count, int len, int pos, bool use_max, int margin,
                                    ScaleFormat scales);

// -----------------------------------------------------------------------------------------------------------------
// Casts, on float values exactly representable in bf16
float amax_bf16_cpu(const float* x, size_t n);
// Per tensor: scale is the multiplier; amax_out (if non-null) is maxed with max |x| as the device's atomic max is.
void fp8_quantize_tensorwise_cpu(uint8_t* data, uint8_t* data_t, float* amax_out, const float* x, int rows, int cols,
                                 float scale, ElementFormat f);
// Block-wise (e with 1x128 or 128x128 blocks): scale_inv / scale_inv_t in the GEMM-ready layouts (padding entries 1).
void fp8_quantize_blockwise_cpu(uint8_t* data, float* scale_inv, uint8_t* data_t, float* scale_inv_t, const float* x,
                                int rows, int cols, const Encoding& e);
void fp8_transpose_codes_cpu(uint8_t* dst, const uint8_t* src, int rows, int cols);

// -----------------------------------------------------------------------------------------------------------------
// Dequantisation and telemetry
void fp8_dequantize_cpu(float* out, const uint8_t* data, const float* scale_inv, int rows, int cols,
                        const Encoding& e);
// The telemetry of quant_stats (finished): scale is a per-tensor cast's multiplier (ignored for blocks, whose
// multipliers come from their amax as the cast computes them); the clipped count is scale_math.cuh's fp8_clipped.
QuantStats fp8_quant_stats_cpu(const float* x, const uint8_t* data, const float* scale_inv, int rows, int cols,
                               const Encoding& e, float scale);

// -----------------------------------------------------------------------------------------------------------------
// FP4 (fp4_ref.cpp): x (rows, cols) of values exactly representable in bf16, e an FP4 encoding, args' rounding, sr_key,
// hadamard and mxfp4_scale as fp4_quantize takes them (args.amax is ignored: tensor_amax, host, is the NVFP4 tensor
// amax of the unrotated copies; null: max |x|). Outputs (each may be null: that copy is not made): codes packed as
// tensor.h says, scale codes in the GEMM-ready layouts with padding entries of 1.0, and for NVFP4 the FP32 decode
// tensor scales of the two copies.
struct Fp4CpuOut {
  uint8_t* data = nullptr;
  uint8_t* scale_inv = nullptr;     // scale_inv_bytes(e, rows, cols)
  uint8_t* data_t = nullptr;
  uint8_t* scale_inv_t = nullptr;   // scale_inv_bytes(e, cols, rows)
  float tensor_scale_inv = 0.0f;
  float tensor_scale_inv_t = 0.0f;
  uint32_t* trust_mask = nullptr;   // MXFP4, with data: rows * ceil(cols / 32) words (args.trust_mask's layout)
};
void fp4_quantize_cpu(Fp4CpuOut* out, const float* x, int rows, int cols, const Encoding& e, const QuantizeArgs& args,
                      const float* tensor_amax);
// The telemetry of quant_stats (finished) of an FP4 data copy: codes / scale codes (rows, cols) encoded e,
// tensor_scale_inv for NVFP4, quantised from x with args' hadamard (data: the statistics of the rotated values) and
// mxfp4_scale. The clipped count is fp4_codec.cuh's e2m1_clipped with each element's multiplier from the definitions
// (fp4_quantize_cpu's block rules on x, not the stored codes; NVFP4's tensor amax is that of the copy's values).
QuantStats fp4_quant_stats_cpu(const float* x, const uint8_t* codes, const uint8_t* scale_inv, float tensor_scale_inv,
                               int rows, int cols, const Encoding& e, const QuantizeArgs& args);
// out (rows, cols) = the values of codes / scale codes (rows, cols) encoded e, tensor_scale_inv for NVFP4.
void fp4_dequantize_cpu(float* out, const uint8_t* codes, const uint8_t* scale_inv, float tensor_scale_inv, int rows,
                        int cols, const Encoding& e);
// The Hadamard transform of every `size` consecutive values of v (n a multiple of size), hadamard.cuh's arithmetic.
void hadamard_cpu(float* v, size_t n, int size, uint32_t signs);

// -----------------------------------------------------------------------------------------------------------------
// GEMMs (FP64 accumulation), row-major as in llmc/precision/gemm.h
// D (M, N) = sum_k dequant(A)[m,k] * dequant(B)[n,k] (+ bias), from the codes and scales of A (M, K) encoded ae and
// B (N, K) encoded be.
void matmul_quant_cpu(double* D, const uint8_t* A, const float* a_scale_inv, const Encoding& ae, const uint8_t* B,
                      const float* b_scale_inv, const Encoding& be, int M, int N, int K, const float* bias);
void matmul_forward_cpu(float* out, const float* inp, const float* weight, const float* bias, int M, int N, int K);
void matmul_dgrad_cpu(float* dinp, const float* dout, const float* weight, int M, int N, int K);
void matmul_wgrad_cpu(float* dweight, const float* dout, const float* inp, int M, int N, int K);

}  // namespace llmc
