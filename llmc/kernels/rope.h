// llmc/kernels/rope.h: rotary position embeddings (Hugging Face rotate_half convention), in place on packed q|k|v.
// Implemented in llmc/kernels/rope.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"

namespace llmc {

// rotary position embeddings, Hugging Face Llama convention ("rotate_half": dimension i pairs with
// i + HS/2; inv_freq[i] = theta^(-2i/HS); angle = t * inv_freq[i] in FP32, cos/sin in FP32), applied in place to the
// NH query heads and NKV key heads of a packed qkv (B, T, (NH + 2*NKV) * HS) (value heads untouched); position t is
// the index within the sequence.
void rope_forward(bf16* qkv, int B, int T, int NH, int NKV, int HS, float theta, cudaStream_t stream);
// In place on dqkv (B, T, (NH + 2*NKV) * HS): the gradient w.r.t. the rotated q, k becomes the gradient w.r.t. the
// unrotated ones (the inverse rotation); value heads untouched. dqkv_amax: max |dqkv| over the whole tensor.
void rope_backward(bf16* dqkv, int B, int T, int NH, int NKV, int HS, float theta, cudaStream_t stream,
                   float* dqkv_amax = nullptr);

}  // namespace llmc
