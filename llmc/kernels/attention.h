// llmc/kernels/attention.h: causal flash-style attention (GQA, head size 64 / 128) forward and deterministic backward;
// the kernel choice (portable mma.sync or Hopper wgmma).
// Implemented in llmc/kernels/attention.cu (portable) and attention_sm90.cu (Hopper); the CPU reference is in
// test/reference/kernels_ref.h. Conventions (layouts, accumulation, determinism, streams) in
// llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"

namespace llmc {

// causal scaled-dot-product attention, flash-style (no (T, T) matrix
// in memory), head size 64 or 128, grouped-query capable (n_kv_head divides n_head; GPT-2 uses n_kv_head == n_head).
//   qkv (B, T, (NH + 2*NKV) * HS): per token the NH query heads, then NKV key heads, then NKV value heads.
//   out (B, T, NH * HS); lse (B, NH, T) FP32 log-sum-exp of the scaled scores (natural log), saved for backward.
//   scale = 1/sqrt(HS). Query head h uses kv head h / (NH / NKV).
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV, int HS,
                       cudaStream_t stream, float* out_amax = nullptr);
// dqkv (B, T, (NH + 2*NKV) * HS) is OVERWRITTEN with the gradient w.r.t. qkv.
// dbias ((NH + 2*NKV) * HS), optional: += the column sums of dqkv as stored (the gradient of a bias added to qkv,
// GPT-2's c_attn.bias; bias_backward's result in another fixed order). The Hopper kernels sum their rows as they
// store them; the portable path makes a pass over dqkv.
// scratch: at least attention_backward_scratch_floats(B, T, NH, HS, dbias != null) floats of device memory.
size_t attention_backward_scratch_floats(int B, int T, int NH, int HS, bool qkv_bias_grad = false);
void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int NH, int NKV, int HS, cudaStream_t stream,
                        float* dqkv_amax = nullptr, float* dbias = nullptr);
// Which kernels attention_forward / attention_backward run: kAuto takes the Hopper wgmma kernels
// (attention_sm90.cu) for head size 64 on a compute-capability 9.0 GPU when the build has sm_90a code, and the
// portable mma.sync kernels otherwise; kPortable always takes the mma.sync kernels (the tests and
// dev/cuda/bench_attention run both). Process-wide; the trainer leaves it at kAuto.
enum class AttentionKernels { kAuto, kPortable };
void set_attention_kernels(AttentionKernels which);
// What attention_forward / attention_backward would run for head size HS on the current device: "sm90 wgmma" or
// "mma.sync".
const char* attention_kernels_name(int HS);

}  // namespace llmc
