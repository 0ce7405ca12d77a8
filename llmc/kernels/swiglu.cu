// llmc/kernels/swiglu.cu: the SwiGLU activation of Llama's MLP on the output of the fused gate|up GEMM, forward and backward;
// kernels and CPU references. gate_up (N, 2F) holds per row [gate (F) | up (F)]; out (N, F) = silu(gate) * up with
// silu(g) = g * sigmoid(g). One thread per 8 outputs (16-byte accesses); the optional amax takes one atomic per block.
#include <cmath>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/swiglu.h"

namespace llmc {

namespace {

constexpr int kSwigluBlock = 256;

__device__ inline float sigmoid_device(float g) { return 1.0f / (1.0f + expf(-g)); }

// out (N, F) = silu(gate) * up. Thread idx handles row n = idx / (F/8), columns j .. j+7.
__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate_up, int N, int F, float* out_amax) {
  const int F8 = F / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned m = 0;
  if (idx < static_cast<size_t>(N) * F8) {
    const size_t n = idx / F8;
    const int j = static_cast<int>(idx % F8) * 8;
    const bf16* row = gate_up + n * 2 * F;
    const x128 g = load128cs(row + j);
    const x128 u = load128cs(row + F + j);
    x128 y;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float gk = __bfloat162float(g[k]);
      y[k] = __float2bfloat16_rn(gk * sigmoid_device(gk) * __bfloat162float(u[k]));
      m = max(m, amax_bits(fabsf(__bfloat162float(y[k]))));
    }
    store128(out + n * F + j, y);
  }
  if (out_amax) block_atomic_max_amax(out_amax, m);
}

// dgate_up (N, 2F) = [dout * up * silu'(gate) | dout * silu(gate)], silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))).
__global__ void swiglu_backward_kernel(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F,
                                       float* amax) {
  const int F8 = F / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned m = 0;
  if (idx < static_cast<size_t>(N) * F8) {
    const size_t n = idx / F8;
    const int j = static_cast<int>(idx % F8) * 8;
    const bf16* row = gate_up + n * 2 * F;
    const x128 g = load128cs(row + j);
    const x128 u = load128cs(row + F + j);
    const x128 d = load128cs(dout + n * F + j);
    x128 dg, du;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float gk = __bfloat162float(g[k]), dk = __bfloat162float(d[k]);
      const float sig = sigmoid_device(gk);
      dg[k] = __float2bfloat16_rn(dk * __bfloat162float(u[k]) * (sig * (1.0f + gk * (1.0f - sig))));
      du[k] = __float2bfloat16_rn(dk * gk * sig);
      m = max(m, amax_bits(fabsf(__bfloat162float(dg[k]))));
      m = max(m, amax_bits(fabsf(__bfloat162float(du[k]))));
    }
    bf16* drow = dgate_up + n * 2 * F;
    store128(drow + j, dg);
    store128(drow + F + j, du);
  }
  if (amax) block_atomic_max_amax(amax, m);
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate_up, int N, int F, cudaStream_t stream, float* out_amax) {
  require_multiple_of_8("swiglu_forward", "F", F);
  require_aligned16("swiglu_forward", "out", out);
  require_aligned16("swiglu_forward", "gate_up", gate_up);
  const size_t threads = static_cast<size_t>(N > 0 ? N : 0) * (F / 8);
  if (threads == 0) return;
  swiglu_forward_kernel<<<ceil_div(threads, kSwigluBlock), kSwigluBlock, 0, stream>>>(out, gate_up, N, F, out_amax);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F, cudaStream_t stream,
                     float* dgate_up_amax) {
  require_multiple_of_8("swiglu_backward", "F", F);
  require_aligned16("swiglu_backward", "dgate_up", dgate_up);
  require_aligned16("swiglu_backward", "dout", dout);
  require_aligned16("swiglu_backward", "gate_up", gate_up);
  const size_t threads = static_cast<size_t>(N > 0 ? N : 0) * (F / 8);
  if (threads == 0) return;
  swiglu_backward_kernel<<<ceil_div(threads, kSwigluBlock), kSwigluBlock, 0, stream>>>(dgate_up, dout, gate_up, N, F,
                                                                                       dgate_up_amax);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
