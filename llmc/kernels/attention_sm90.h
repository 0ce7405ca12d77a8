// llmc/kernels/attention_sm90.h: the Hopper (sm_90a, wgmma) attention kernels for head size 64, used by llmc/kernels/attention.cu's
// entry points when the GPU and the build support them. Internal to the attention module: callers use kernels.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace llmc {

using bf16 = __nv_bfloat16;

// True when this build contains sm_90a code and the current device is compute capability 9.0.
bool attention_sm90_available();

// Same contracts as attention_forward / the dK, dV, dQ part of attention_backward (kernels.h), head size 64 only.
// dsum (B, NH, T) = rowsum(dout * out), computed by the caller.
void attention_forward_sm90(bf16* out, float* lse, float* out_amax, const bf16* qkv, int B, int T, int NH, int NKV,
                            cudaStream_t stream);
// bias_partials (attention_sm90_bias_partial_rows(B, T), (NH + 2*NKV) * 64), optional: row b * ceil(T/128) + k
// is overwritten with the column sums of the dqkv rows [128k, 128k + 128) of sequence b (as stored, in bf16), for the
// caller's sum_column_partials into the qkv bias gradient.
int attention_sm90_bias_partial_rows(int B, int T);
void attention_backward_sm90(bf16* dqkv, float* dqkv_amax, float* bias_partials, const float* dsum, const bf16* dout,
                             const bf16* qkv, const float* lse, int B, int T, int NH, int NKV, cudaStream_t stream);

}  // namespace llmc
