// llmc/precision/gemm.h: the cuBLASLt wrapper for every linear layer. BF16 inputs, FP32 accumulation, bias and GELU
// epilogues, one workspace, algorithm selection cached per (shape, layout, epilogue); and the quantised products,
// chosen from the operands' encodings (today FP8 with per-tensor, 1x128 or 128x128 block scales) in the TN form
// Hopper's FP8 tensor cores require. CPU references: test/reference/precision_ref.h.
//
// All matrices are row-major as the model stores them:
//   inp (M, K) activations, weight (N, K) in nn.Linear layout, out (M, N).
// The three products of a linear layer:
//   forward  out   (M, N) = inp (M, K) · weight (N, K)ᵀ [+ bias (N)]            bf16 out
//   dgrad    dinp  (M, K) = dout (M, N) · weight (N, K)                         bf16 out
//   wgrad    dweight (N, K) (+)= dout (M, N)ᵀ · inp (M, K)                       FP32 out (parameter gradients)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/precision/tensor.h"

namespace llmc {

using bf16 = __nv_bfloat16;

// The cuBLASLt workspace every GEMM shares (the trainer's; the memory plan counts it).
constexpr size_t kGemmWorkspaceBytes = 32u << 20;
// Creates the cuBLASLt handle and the workspace on the current device. Idempotent.
void gemm_init(size_t workspace_bytes = kGemmWorkspaceBytes);
void gemm_shutdown();
// Algorithm tuning of the BF16 products (on by default): the first call of each forward / dgrad GEMM times the
// heuristic's candidates and keeps the fastest whose output is bitwise equal to the heuristic's first choice on that
// call's operands (it synchronises the stream once per new GEMM). Results never depend on it; off, every GEMM runs
// the heuristic's first choice. Applies to GEMMs first run after the call (gemm_shutdown clears the cache).
void gemm_set_algorithm_tuning(bool on);

// out = inp · weightᵀ + bias (bias may be null).
// If pre_gelu is non-null: pre_gelu = inp · weightᵀ + bias and out = gelu_tanh(pre_gelu) (cuBLASLt GELU_AUX epilogue).
// If residual (M, N) is non-null (not with pre_gelu): out = residual + inp · weightᵀ + bias, summed in FP32 and
// rounded to bf16 once (cuBLASLt's C operand with beta = 1; out and residual must not overlap).
void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int M, int N, int K,
                    cudaStream_t stream, bf16* pre_gelu = nullptr, const bf16* residual = nullptr);

// dinp = dout · weight, overwritten (accumulate=false) or added (accumulate=true; the product is rounded to bf16
// before the existing bf16 values are added, as cuBLASLt does with a bf16 C operand).
// If pre_gelu is non-null: dinp = (dout · weight) * gelu_tanh'(pre_gelu) (cuBLASLt DGELU epilogue); accumulate must be
// false then.
void matmul_dgrad(bf16* dinp, const bf16* dout, const bf16* weight, int M, int N, int K, bool accumulate,
                  cudaStream_t stream, const bf16* pre_gelu = nullptr);

// dweight (FP32) = doutᵀ · inp, overwritten or accumulated.
void matmul_wgrad(float* dweight, const bf16* dout, const bf16* inp, int M, int N, int K, bool accumulate,
                  cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------------
// Quantised products, chosen from the operands' encodings (llmc/precision/encoding.h). Today's mapping: E4M3 / E5M2
// codes with FP32 (or power-of-two) scales per tensor (SCALAR_32F) or per 1x128 / 128x128 block (VEC128_32F /
// BLK128x128_32F) on FP8 tensor cores. Hopper's FP8 tensor cores take both operands K-contiguous ("TN"), so every
// product is written as
//   D (M, N) = A (M, K) · B (N, K)ᵀ        A, B row-major codes, FP32 accumulation
// and the three products of a linear layer use the transposed copies of llmc/precision/tensor.h:
//   fprop  Y  (M, N) = Xq  (M, K) · Wq  (N, K)ᵀ
//   dgrad  dX (M, K) = dYq (M, N) · Wᵀq (K, N)ᵀ          (Wᵀq = the weight's data_t)
//   wgrad  dW (N, K) = dYᵀq (N, M) · Xᵀq (K, M)ᵀ         (data_t of dY and of X)
// Scales: per-tensor scale_inv pointers, or block scales in the GEMM-ready layouts of llmc/precision/tensor.h (at
// most one operand 128x128). Every dimension a multiple of quant_gemm_dim_multiple (16; 128 with block scales).
// Formats: e4m3 * e4m3, e5m2 * e4m3 and e4m3 * e5m2 (cuBLASLt has no e5m2 * e5m2). Per-tensor scales on both
// operands or block scales on both. Fast accumulation only with per-tensor scales. Data, D, bias, pre_gelu and block
// scales 16-byte aligned. Anything else is an llmc::Error naming the argument, thrown before cuBLASLt is asked; a
// combination cuBLASLt does not run on this GPU (no FP8 tensor cores, block scales below compute capability 9.0, an
// epilogue its heuristic has no kernel for) is an llmc::Error naming the combination and cuBLASLt's status.
// Not offered: quantised outputs, and the amax of D (cuBLASLt computes AMAX_D only for FP8 outputs).
struct QuantOperand {
  const uint8_t* data = nullptr;     // (rows, K) row-major codes
  Encoding encoding;                 // how they are encoded (element format, scale blocks, scale format)
  const float* scale_inv = nullptr;  // device: 1 float, or the GEMM-ready block scales of (rows, K)
};
// The operands of a QTensor: its data with scale_inv, or (transposed) its data_t with scale_inv_t (whole-tensor
// scale: scale_inv).
QuantOperand quant_operand(const QTensor& q, bool transposed);

struct QuantGemmOptions {
  const bf16* bias = nullptr;  // (N) added to every row of D (bf16 D only)
  bf16* pre_gelu = nullptr;    // GELU_AUX: pre_gelu (M, N) = A·Bᵀ + bias, D = gelu_tanh(pre_gelu) (bf16 D only)
  bool accumulate = false;     // D += A·Bᵀ (FP32 D only)
  bool fast_accum = false;     // CUBLASLT_MATMUL_DESC_FAST_ACCUM: per-tensor scales only (fprop)
};
// D (M, N) bf16 = A·Bᵀ (+ bias, GELU_AUX).
void matmul_quant(bf16* D, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                  const QuantGemmOptions& opt, cudaStream_t stream);
// D (M, N) FP32 = A·Bᵀ, or D += A·Bᵀ with opt.accumulate (weight gradients).
void matmul_quant(float* D, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                  const QuantGemmOptions& opt, cudaStream_t stream);
// Whether cuBLASLt on this device runs this combination (tensor cores present, scale modes and epilogue supported);
// cached. The linear layer falls back (e.g. GELU in a separate kernel) where it does not. False also for arguments
// matmul_quant would reject. The epilogue is read from opt (bias / pre_gelu non-null); null data or scale pointers
// are allowed here, D is taken as 256-byte aligned (as cudaMalloc returns it).
bool matmul_quant_supported(bool d_fp32, const QuantOperand& A, const QuantOperand& B, int M, int N, int K,
                            const QuantGemmOptions& opt);

// The GEMM mapping as the recipes ask it (host only, no device needed):
// Empty when a product of operands encoded a and b exists, else why not, naming them a_name and b_name (e.g. "x",
// "w"): an encoding with no cuBLASLt mapping, per-tensor with block scales, 128x128 on both sides, e5m2 on both.
std::string quant_gemm_operands_error(const Encoding& a, const char* a_name, const Encoding& b, const char* b_name);
// The compute capability that product needs (89: FP8 tensor cores; 90: block-scaled FP8); a and b as above.
int quant_gemm_min_compute_capability(const Encoding& a, const Encoding& b);
// The multiple every dimension (M, N, K) of a product with an operand encoded e must be: 16-byte rows of FP8 codes,
// and whole blocks along K.
constexpr int kQuantGemmAlign = 16;
int quant_gemm_dim_multiple(const Encoding& e);
// The compute capability of the BF16 products (BF16 tensor cores).
constexpr int kBf16GemmMinComputeCapability = 80;

}  // namespace llmc
