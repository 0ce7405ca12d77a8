// llmc/kernels/swiglu.h: SwiGLU on the fused gate|up projection output, forward and backward.
// Implemented in llmc/kernels/swiglu.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"

namespace llmc {

// gate_up (N, 2F) holds per row [gate (F) | up (F)] (the fused gate_proj|up_proj GEMM output);
// out (N, F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void swiglu_forward(bf16* out, const bf16* gate_up, int N, int F, cudaStream_t stream, float* out_amax = nullptr);
// dgate_up (N, 2F) = [dout * up * silu'(gate) | dout * silu(gate)] (overwritten).
void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F, cudaStream_t stream,
                     float* dgate_up_amax = nullptr);

}  // namespace llmc
