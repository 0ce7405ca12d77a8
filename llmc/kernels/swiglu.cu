// llmc/kernels/swiglu.cu: the SwiGLU activation of Llama's MLP on the output of the fused gate|up GEMM, forward and backward;
// kernels and CPU references. gate_up (N, 2F) holds per row [gate (F) | up (F)]; out (N, F) = silu(gate) * up with
// silu(g) = g * sigmoid(g). One thread per 8 outputs (16-byte accesses); the optional amax takes one atomic per block.
// The forward optionally writes the FP8 1x16 copy of gate_up (template kSave), the backward reads gate_up through a
// loader (BF16 or that copy; llmc/kernels/fp8_groups.cuh): one copy of each algorithm, the BF16 instantiations are the
// kernels as they were.
#include <cmath>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/fp8_groups.cuh"
#include "llmc/kernels/swiglu.h"

namespace llmc {

namespace {

constexpr int kSwigluBlock = 256;

__device__ inline float sigmoid_device(float g) { return 1.0f / (1.0f + expf(-g)); }

// out (N, F) = silu(gate) * up. Thread idx handles row n = idx / (F/8), columns j .. j+7. kSave: the FP8 copy of
// gate_up (N, 2F) into save (F a multiple of 16: threads idx and idx ^ 1 hold the two halves of a group, in both
// halves of the row).
template <bool kSave>
__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate_up, int N, int F, float* out_amax,
                                      const Fp8GroupsOut save) {
  const int F8 = F / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned m = 0;
  if (idx < static_cast<size_t>(N) * F8) {
    const size_t n = idx / F8;
    const int j = static_cast<int>(idx % F8) * 8;
    const bf16* row = gate_up + n * 2 * F;
    const x128 g = load128cs(row + j);
    const x128 u = load128cs(row + F + j);
    if constexpr (kSave) {
      fp8_groups_store8(save, g, static_cast<int>(n), j, N, 2 * F);
      fp8_groups_store8(save, u, static_cast<int>(n), F + j, N, 2 * F);
    }
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
// gate_up: the loader of (N, 2F).
template <class Loader>
__global__ void swiglu_backward_kernel(bf16* dgate_up, const bf16* dout, const Loader gate_up, int N, int F,
                                       float* amax) {
  const int F8 = F / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned m = 0;
  if (idx < static_cast<size_t>(N) * F8) {
    const size_t n = idx / F8;
    const int j = static_cast<int>(idx % F8) * 8;
    float g[8], u[8];
    gate_up.load8cs(g, n * 2 * F + j, static_cast<int>(n), j);
    gate_up.load8cs(u, n * 2 * F + F + j, static_cast<int>(n), F + j);
    const x128 d = load128cs(dout + n * F + j);
    x128 dg, du;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float gk = g[k], dk = __bfloat162float(d[k]);
      const float sig = sigmoid_device(gk);
      dg[k] = __float2bfloat16_rn(dk * u[k] * (sig * (1.0f + gk * (1.0f - sig))));
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

template <class Loader>
void launch_swiglu_backward(bf16* dgate_up, const bf16* dout, const Loader gate_up, int N, int F,
                            cudaStream_t stream, float* dgate_up_amax) {
  const size_t threads = static_cast<size_t>(N > 0 ? N : 0) * (F / 8);
  if (threads == 0) return;
  swiglu_backward_kernel<<<ceil_div(threads, kSwigluBlock), kSwigluBlock, 0, stream>>>(dgate_up, dout, gate_up, N, F,
                                                                                       dgate_up_amax);
  CUDA_CHECK_LAUNCH();
}

void check_swiglu_backward_args(const char* kernel, const bf16* dgate_up, const bf16* dout, int F) {
  require_multiple_of_8(kernel, "F", F);
  require_aligned16(kernel, "dgate_up", dgate_up);
  require_aligned16(kernel, "dout", dout);
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate_up, int N, int F, cudaStream_t stream, float* out_amax,
                    const Fp8GroupsOut& save_gate_up) {
  require_multiple_of_8("swiglu_forward", "F", F);
  require_aligned16("swiglu_forward", "out", out);
  require_aligned16("swiglu_forward", "gate_up", gate_up);
  if (save_gate_up.wanted())
    require_fp8_groups("swiglu_forward", "save_gate_up (F)", save_gate_up.codes, save_gate_up.scale_inv, F);
  const size_t threads = static_cast<size_t>(N > 0 ? N : 0) * (F / 8);
  if (threads == 0) return;
  if (save_gate_up.wanted())
    swiglu_forward_kernel<true><<<ceil_div(threads, kSwigluBlock), kSwigluBlock, 0, stream>>>(out, gate_up, N, F,
                                                                                              out_amax, save_gate_up);
  else
    swiglu_forward_kernel<false><<<ceil_div(threads, kSwigluBlock), kSwigluBlock, 0, stream>>>(out, gate_up, N, F,
                                                                                               out_amax, save_gate_up);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F, cudaStream_t stream,
                     float* dgate_up_amax) {
  check_swiglu_backward_args("swiglu_backward", dgate_up, dout, F);
  require_aligned16("swiglu_backward", "gate_up", gate_up);
  launch_swiglu_backward(dgate_up, dout, Bf16Loader{gate_up}, N, F, stream, dgate_up_amax);
}

void swiglu_backward(bf16* dgate_up, const bf16* dout, const Fp8Groups& gate_up, int N, int F, cudaStream_t stream,
                     float* dgate_up_amax) {
  const char* kernel = "swiglu_backward (fp8 input)";
  check_swiglu_backward_args(kernel, dgate_up, dout, F);
  require_fp8_groups(kernel, "gate_up (F)", gate_up.codes, gate_up.scale_inv, F);
  launch_swiglu_backward(dgate_up, dout, fp8_groups_loader(gate_up, N), N, F, stream, dgate_up_amax);
}

}  // namespace llmc
