// llmc/precision/gemm.h: the cuBLASLt wrapper for every linear layer. BF16 inputs, FP32 accumulation, bias and GELU
// epilogues, one workspace, algorithm selection cached per (shape, layout, epilogue); and the quantised products,
// chosen from the operands' encodings (FP8 with per-tensor, 1x128 or 128x128 block scales; MXFP4 and NVFP4 carried
// exactly onto the FP8 and BF16 tensor cores) in the TN form Hopper's FP8 tensor cores require. CPU references:
// test/reference/precision_ref.h and test/reference/fp4_gemm_ref.h.
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
//
// FP4 products (Hopper has no FP4 tensor cores; llmc/precision/fp4_gemm.h converts the operands, exactly, into a
// scratch buffer the GEMM layer owns, and runs the product on them; quant_gemm_scratch_bytes gives its size):
//   mxfp4 * mxfp4  both operands re-encoded as E4M3 with a power-of-two outer scale per (row, 128 columns), then the
//                  FP8 product above with 1x128 scales on both sides (VEC128_32F; split accumulation). Exact unless
//                  the elements of one row's 128-column run span more binades than E4M3 holds
//                  (llmc/precision/fp4_remap.cuh); the MXFP4 blocks where that happened are added to
//                  *opt.inexact_blocks (required). Compute capability 9.0; M, N multiples of 16; any K (zero-padded).
//   nvfp4 * nvfp4  (1x16 or 16x16 blocks on either side) both operands expanded into BF16 (e2m1 * block scale,
//                  exact), then a BF16 product D = alpha · A·Bᵀ with alpha = the two FP32 tensor scales' product
//                  (a device scalar, as Blackwell's NVFP4 GEMMs apply it). Compute capability 8.0; N a multiple of 8;
//                  any M and K. An operand that carries its values (QuantOperand::values, written by the quantiser)
//                  is read as it is, not expanded.
// The same options otherwise (bias / GELU_AUX for a bf16 D, accumulate for FP32 D; no fast_accum). Any other pair
// with an FP4 operand is an llmc::Error naming both encodings.
struct QuantOperand {
  const uint8_t* data = nullptr;     // (rows, K) row-major codes (FP4: packed two per byte, tensor.h)
  Encoding encoding;                 // how they are encoded (element format, scale blocks, scale format)
  const float* scale_inv = nullptr;  // device: 1 float, or the GEMM-ready block scales of (rows, K) (FP4: one-byte
                                     // scale codes, read as uint8_t)
  const float* tensor_scale_inv = nullptr;  // device (1): the second-level FP32 decode scale (NVFP4), else unused
  const bf16* values = nullptr;  // NVFP4: the decoded values (rows, K) BF16 without the tensor scale (QTensor::values;
                                 // K a multiple of 8, 16-byte aligned): the product reads them instead of expanding
                                 // data, which (with scale_inv) may then be null
};
// The operands of a QTensor: its data with scale_inv (and tensor_scale_inv), or (transposed) its data_t with
// scale_inv_t (and tensor_scale_inv_t) (whole-tensor scale: scale_inv); values / values_t where the QTensor has them.
QuantOperand quant_operand(const QTensor& q, bool transposed);

struct QuantGemmOptions {
  const bf16* bias = nullptr;  // (N) added to every row of D (bf16 D only)
  bf16* pre_gelu = nullptr;    // GELU_AUX: pre_gelu (M, N) = A·Bᵀ + bias, D = gelu_tanh(pre_gelu) (bf16 D only)
  bool accumulate = false;     // D += A·Bᵀ (FP32 D only)
  bool fast_accum = false;     // CUBLASLT_MATMUL_DESC_FAST_ACCUM: per-tensor scales only (fprop)
  // MXFP4 products: device counter, increased by the number of A's and B's 32-element blocks that the E4M3 remap
  // could not keep exactly (0 for data whose 128-column runs stay within E4M3's range; the caller zeroes and reports
  // it, e.g. in the numerics telemetry). Required for them, unused otherwise.
  unsigned long long* inexact_blocks = nullptr;
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
// The compute capability that product needs (89: FP8 tensor cores; 90: block-scaled FP8, MXFP4; 80: NVFP4 in BF16);
// a and b as above.
int quant_gemm_min_compute_capability(const Encoding& a, const Encoding& b);
// The multiple every dimension (M, N, K) of a product with an operand encoded e must be: 16-byte rows of FP8 codes,
// and whole blocks along K; for FP4 what the converted product needs of M and N (MXFP4 16, NVFP4 8: K is free).
constexpr int kQuantGemmAlign = 16;
int quant_gemm_dim_multiple(const Encoding& e);
// Bytes of the scratch buffer the product of A (M, K) encoded a and B (N, K) encoded b converts its operands into
// (0 for FP8 products), for the memory plan; a_values / b_values: that NVFP4 operand will carry its values (nothing
// to expand). The GEMM layer allocates it on first use and keeps the largest (freed by gemm_shutdown); FP4 products
// share it as all GEMMs share the workspace, so they run on one stream at a time.
size_t quant_gemm_scratch_bytes(const Encoding& a, const Encoding& b, int M, int N, int K, bool a_values = false,
                                bool b_values = false);
// The compute capability of the BF16 products (BF16 tensor cores).
constexpr int kBf16GemmMinComputeCapability = 80;

}  // namespace llmc
