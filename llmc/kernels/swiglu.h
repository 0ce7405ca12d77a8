// llmc/kernels/swiglu.h: SwiGLU on the fused gate|up projection output, forward and backward.
// Implemented in llmc/kernels/swiglu.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"
#include "llmc/kernels/fp8_groups.h"

namespace llmc {

// gate_up (N, 2F) holds per row [gate (F) | up (F)] (the fused gate_proj|up_proj GEMM output);
// out (N, F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
// save_gate_up (optional): the FP8 1x16 copy of gate_up (N, 2F) (llmc/kernels/fp8_groups.h; F a multiple of 16),
// written in the same pass, for the backward that reads it; out is the same bits either way.
// from_copy: out from the values of that copy instead of gate_up's (COAT's FP8 flow; the copy is cast in the same
// pass whether or not save_gate_up stores it; F a multiple of 16): the bits the overload below recomputes.
void swiglu_forward(bf16* out, const bf16* gate_up, int N, int F, cudaStream_t stream, float* out_amax = nullptr,
                    const Fp8GroupsOut& save_gate_up = {}, bool from_copy = false);
// out (N, F) from a stored FP8 1x16 copy of gate_up: the same bits as the from_copy forward that stored it.
void swiglu_forward(bf16* out, const Fp8Groups& gate_up, int N, int F, cudaStream_t stream, float* out_amax = nullptr);
// dgate_up (N, 2F) = [dout * up * silu'(gate) | dout * silu(gate)] (overwritten).
void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F, cudaStream_t stream,
                     float* dgate_up_amax = nullptr);
// The same with gate_up read from its FP8 1x16 copy (F a multiple of 16): the same kernel and arithmetic on the
// dequantised values.
void swiglu_backward(bf16* dgate_up, const bf16* dout, const Fp8Groups& gate_up, int N, int F, cudaStream_t stream,
                     float* dgate_up_amax = nullptr);

}  // namespace llmc
