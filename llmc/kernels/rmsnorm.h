// llmc/kernels/rmsnorm.h: RMSNorm forward (plain and fused with a residual add) and backward, FP32 statistics.
// Implemented in llmc/kernels/rmsnorm.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"

namespace llmc {

// RMSNorm with FP32 statistics: out (N, C) = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps);
// rstd (N) saved for backward.
void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C, float eps,
                     cudaStream_t stream, float* out_amax = nullptr);
// residual (N, C) = inp1 + inp2 (rounded to bf16), then out = RMSNorm(residual) from the rounded residual.
void fused_residual_rmsnorm_forward(bf16* residual, bf16* out, float* rstd, const bf16* inp1, const bf16* inp2,
                                    const bf16* weight, int N, int C, float eps, cudaStream_t stream,
                                    float* out_amax = nullptr);
// dinp (N, C) += dRMSNorm/dinp; dweight (C) += ... (FP32). scratch: rmsnorm_backward_scratch_floats(N, C) floats.
// dinp_amax receives max |dinp| after the addition (the final value written).
size_t rmsnorm_backward_scratch_floats(int N, int C);
void rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout, const bf16* inp,
                      const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream,
                      float* dinp_amax = nullptr);

}  // namespace llmc
