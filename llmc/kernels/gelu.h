// llmc/kernels/gelu.h: GELU (tanh approximation) forward and in-place backward.
// Implemented in llmc/kernels/gelu.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"
#include "llmc/kernels/fp8_groups.h"

namespace llmc {

// GELU, tanh approximation (as GPT-2 / PyTorch approximate="tanh")
void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream, float* out_amax = nullptr);
// dinout (n): in = d out, out = d inp = d out * gelu'(inp)
void gelu_backward_inplace(bf16* dinout, const bf16* inp, size_t n, cudaStream_t stream, float* dinp_amax = nullptr);
// The same over inp (N, C) with save_inp (optional): the FP8 1x16 copy of inp (llmc/kernels/fp8_groups.h; C a
// multiple of 16), written in the same pass, for the backward that reads it; out is the same bits either way.
// from_copy: out from the values of that copy instead of inp's (COAT's FP8 flow; the copy is cast in the same pass
// whether or not save_inp stores it; C a multiple of 16): the bits the overload below recomputes.
void gelu_forward(bf16* out, const bf16* inp, int N, int C, cudaStream_t stream, float* out_amax,
                  const Fp8GroupsOut& save_inp, bool from_copy = false);
// out (N, C) = gelu of a stored FP8 1x16 copy of the input: the same bits as the from_copy forward that stored it.
void gelu_forward(bf16* out, const Fp8Groups& inp, int N, int C, cudaStream_t stream, float* out_amax = nullptr);
// The backward with inp (N, C) read from its FP8 1x16 copy: the same kernel and arithmetic on the dequantised values.
void gelu_backward_inplace(bf16* dinout, const Fp8Groups& inp, int N, int C, cudaStream_t stream,
                           float* dinp_amax = nullptr);

}  // namespace llmc
