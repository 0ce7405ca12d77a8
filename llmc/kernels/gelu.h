// llmc/kernels/gelu.h: GELU (tanh approximation) forward and in-place backward.
// Implemented in llmc/kernels/gelu.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"

namespace llmc {

// GELU, tanh approximation (as GPT-2 / PyTorch approximate="tanh")
void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream, float* out_amax = nullptr);
// dinout (n): in = d out, out = d inp = d out * gelu'(inp)
void gelu_backward_inplace(bf16* dinout, const bf16* inp, size_t n, cudaStream_t stream, float* dinp_amax = nullptr);

}  // namespace llmc
