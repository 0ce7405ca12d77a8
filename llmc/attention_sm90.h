// llmc/attention_sm90.h: the Hopper (sm_90a, wgmma) attention kernels for head size 64, used by llmc/attention.cu's
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
void attention_backward_sm90(bf16* dqkv, float* dqkv_amax, const float* dsum, const bf16* dout, const bf16* qkv,
                             const float* lse, int B, int T, int NH, int NKV, cudaStream_t stream);

}  // namespace llmc
