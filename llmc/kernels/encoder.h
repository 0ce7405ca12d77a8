// llmc/kernels/encoder.h: token + position embedding (GPT-2) or token embedding alone (Llama), and its deterministic
// backward.
// Implemented in llmc/kernels/encoder.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions (layouts,
// accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"

namespace llmc {

// token + position embedding (GPT-2), or token embedding alone (Llama: wpe = null, dwpe = null)
// out (N=B*T, C) = wte[tokens[b,t]] + wpe[t]  (wpe null: out = wte[tokens[b,t]] exactly)
void encoder_forward(bf16* out, const int* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     cudaStream_t stream);

// Deterministic embedding backward. The host builds the plan from the host copy of the tokens of this micro-batch
// (grouping positions by token id in a fixed order); the kernel then sums each token's rows in that order.
// dwte (Vp, C) += ...; dwpe (maxT, C) += sum over b of dout[b, t] (skipped when dwpe is null).
struct EncoderBackwardPlan {
  // device buffers owned by the plan (allocated on first build, grown as needed)
  int* d_bucket_starts = nullptr;  // (num_buckets + 1) offsets into d_positions
  int* d_bucket_tokens = nullptr;  // (num_buckets) token id of each bucket
  int* d_positions = nullptr;      // (B*T) flat positions b*T+t, grouped by token, ascending within a group
  int* d_bucket_order = nullptr;   // (num_buckets) the buckets in launch order: largest first
  int num_buckets = 0;
  size_t capacity = 0;
  // pinned host staging of the four arrays (the async upload reads it after build returns), and the event that
  // tells when the previous upload has finished reading it
  int* h_staging = nullptr;  // (4 * capacity + 1) ints: bucket starts, bucket tokens, positions, bucket order
  cudaEvent_t uploaded = nullptr;
  void build(const int* host_tokens, int B, int T, cudaStream_t stream);  // uploads with cudaMemcpyAsync
  void free();
};
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const EncoderBackwardPlan& plan, int B, int T,
                      int C, cudaStream_t stream);

}  // namespace llmc
