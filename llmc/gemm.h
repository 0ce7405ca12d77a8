// llmc/gemm: the cuBLASLt wrapper for every linear layer. BF16 inputs, FP32 accumulation, bias and GELU epilogues,
// one workspace, algorithm selection cached per (shape, layout, epilogue). Later recipes extend it with FP8.
//
// All matrices are row-major as the model stores them:
//   inp (M, K) activations, weight (N, K) in nn.Linear layout, out (M, N).
// The three products of a linear layer:
//   forward  out   (M, N) = inp (M, K) · weight (N, K)ᵀ [+ bias (N)]            bf16 out
//   dgrad    dinp  (M, K) = dout (M, N) · weight (N, K)                         bf16 out
//   wgrad    dweight (N, K) (+)= dout (M, N)ᵀ · inp (M, K)                       FP32 out (parameter gradients)
#pragma once

#include <cstddef>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace llmc {

using bf16 = __nv_bfloat16;

// Creates the cuBLASLt handle and the workspace on the current device. Idempotent.
void gemm_init(size_t workspace_bytes = 32u << 20);
void gemm_shutdown();

// out = inp · weightᵀ + bias (bias may be null).
// If pre_gelu is non-null: pre_gelu = inp · weightᵀ + bias and out = gelu_tanh(pre_gelu) (cuBLASLt GELU_AUX epilogue).
void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int M, int N, int K,
                    cudaStream_t stream, bf16* pre_gelu = nullptr);

// dinp = dout · weight, overwritten (accumulate=false) or added (accumulate=true; the product is rounded to bf16
// before the existing bf16 values are added, as cuBLASLt does with a bf16 C operand).
// If pre_gelu is non-null: dinp = (dout · weight) * gelu_tanh'(pre_gelu) (cuBLASLt DGELU epilogue); accumulate must be
// false then.
void matmul_dgrad(bf16* dinp, const bf16* dout, const bf16* weight, int M, int N, int K, bool accumulate,
                  cudaStream_t stream, const bf16* pre_gelu = nullptr);

// dweight (FP32) = doutᵀ · inp, overwritten or accumulated.
void matmul_wgrad(float* dweight, const bf16* dout, const bf16* inp, int M, int N, int K, bool accumulate,
                  cudaStream_t stream);

// CPU references (FP64 accumulation) used by the GEMM tests.
void matmul_forward_cpu(float* out, const float* inp, const float* weight, const float* bias, int M, int N, int K);
void matmul_dgrad_cpu(float* dinp, const float* dout, const float* weight, int M, int N, int K);
void matmul_wgrad_cpu(float* dweight, const float* dout, const float* inp, int M, int N, int K);

}  // namespace llmc
