// llmc/kernels/rmsnorm.h: RMSNorm forward (plain and fused with a residual add) and backward, FP32 statistics.
// Implemented in llmc/kernels/rmsnorm.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"
#include "llmc/kernels/fp8_groups.h"

namespace llmc {

// RMSNorm with FP32 statistics: out (N, C) = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps);
// rstd (N) saved for backward. save_inp (optional): the FP8 1x16 copy of inp (llmc/kernels/fp8_groups.h; C a
// multiple of 16), written in the same pass, for the backward that reads it; out and rstd are the same bits either way.
void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* weight, int N, int C, float eps,
                     cudaStream_t stream, float* out_amax = nullptr, const Fp8GroupsOut& save_inp = {});
// residual (N, C) = inp1 + inp2 (rounded to bf16), then out = RMSNorm(residual) from the rounded residual.
// save_residual (optional): the FP8 1x16 copy of residual, as save_inp above.
void fused_residual_rmsnorm_forward(bf16* residual, bf16* out, float* rstd, const bf16* inp1, const bf16* inp2,
                                    const bf16* weight, int N, int C, float eps, cudaStream_t stream,
                                    float* out_amax = nullptr, const Fp8GroupsOut& save_residual = {});
// dinp (N, C) += dRMSNorm/dinp; dweight (C) += ... (FP32). scratch: rmsnorm_backward_scratch_floats(N, C) floats.
// dinp_amax receives max |dinp| after the addition (the final value written).
size_t rmsnorm_backward_scratch_floats(int N, int C);
void rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout, const bf16* inp,
                      const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream,
                      float* dinp_amax = nullptr);
// The same with x read from its FP8 1x16 copy (C a multiple of 16): the same kernels and arithmetic on the
// dequantised values (rstd is the forward's, from the BF16 x).
void rmsnorm_backward(bf16* dinp, float* dweight, float* scratch, const bf16* dout, const Fp8Groups& inp,
                      const bf16* weight, const float* rstd, int N, int C, cudaStream_t stream,
                      float* dinp_amax = nullptr);

}  // namespace llmc
