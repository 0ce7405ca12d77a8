// llmc/kernels/layernorm.h: LayerNorm forward (plain and fused with a residual add) and backward, FP32 statistics.
// Implemented in llmc/kernels/layernorm.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"
#include "llmc/kernels/fp8_groups.h"

namespace llmc {

// GPT-2's LayerNorm epsilon (the kernels and the references use this value).
constexpr float kLayerNormEps = 1e-5f;

// LayerNorm (eps = 1e-5) with FP32 statistics
// out (N, C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved for backward.
// Optional out_amax / dinp_amax (may be null) in this and the other kernels that produce the input or the output
// gradient of a linear layer: max |value written| is atomically maxed into that float (llmc/core/cuda_utils.cuh
// atomic_max_amax; the caller zeroed it), the amax of the FP8 per-tensor scale of the linear that consumes it.
// save_inp (optional): the FP8 1x16 copy of inp (llmc/kernels/fp8_groups.h; C a multiple of 16), written in the same
// pass, for the backward that reads it; out, mean, rstd and out_amax are the same bits either way.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                       int N, int C, cudaStream_t stream, float* out_amax = nullptr, const Fp8GroupsOut& save_inp = {});

// residual (N, C) = inp1 + inp2 (rounded to bf16), then out = LayerNorm(residual) from the rounded residual.
// save_residual (optional): the FP8 1x16 copy of residual, as save_inp above.
void fused_residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* inp1,
                                      const bf16* inp2, const bf16* weight, const bf16* bias, int N, int C,
                                      cudaStream_t stream, float* out_amax = nullptr,
                                      const Fp8GroupsOut& save_residual = {});

// dinp (N, C) += dLN/dinp;  dweight (C) += ...;  dbias (C) += ...  (FP32 parameter gradients)
// scratch: at least layernorm_backward_scratch_floats(N, C) floats of device memory (for deterministic partial sums).
size_t layernorm_backward_scratch_floats(int N, int C);
// dinp_amax: max |dinp| after the addition (the final value written).
// dinp_sum (C), optional: += the column sums of dinp after the addition (the bf16 values written). In GPT-2 dinp is
// the residual-stream gradient, i.e. the output gradient of the projection that adds into the residual there, so
// this is that projection's bias gradient without a separate pass over dinp (bias_backward's result, summed in
// another fixed order).
void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream,
                        float* dinp_amax = nullptr, float* dinp_sum = nullptr);
// The same with x read from its FP8 1x16 copy (C a multiple of 16): the same kernels and arithmetic on the
// dequantised values (mean and rstd are the forward's, from the BF16 x).
void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout,
                        const Fp8Groups& inp, const bf16* weight, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream, float* dinp_amax = nullptr, float* dinp_sum = nullptr);

}  // namespace llmc
