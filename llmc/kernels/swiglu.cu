// llmc/kernels/swiglu.cu: the SwiGLU activation of Llama's MLP on the output of the fused gate|up GEMM, forward and backward;
// kernels and CPU references. gate_up (N, 2F) holds per row [gate (F) | up (F)]; out (N, F) = silu(gate) * up with
// silu(g) = g * sigmoid(g). One thread per 8 outputs (16-byte accesses); the optional amax takes one atomic per block.
// The forward optionally writes the FP8 1x16 copy of gate_up (template kSave) and optionally computes from that copy's
// values (kQuantised: COAT's FP8 flow, which the recomputation from the stored copy repeats bit for bit); forward and
// backward read gate_up through a loader (BF16 or the stored copy; llmc/kernels/fp8_groups.cuh): one copy of each
// algorithm.
#include <cmath>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/fp8_groups.cuh"
#include "llmc/kernels/swiglu.h"

namespace llmc {

namespace {

constexpr int kSwigluBlock = 256;

__device__ inline float sigmoid_device(float g) { return 1.0f / (1.0f + expf(-g)); }

// out (N, F) = silu(gate) * up. Thread idx handles row n = idx / (F/8), columns j .. j+7. gate_up: the loader of
// (N, 2F) (BF16, or a stored FP8 copy: the recomputation of kQuantised's output). kSave: the FP8 copy of the BF16
// gate_up into save; kQuantised: out from the values of that copy rather than from gate_up (cast in registers,
// stored or not). Either needs F a multiple of 16 (threads idx and idx ^ 1 hold the two halves of a group, in both
// halves of the row).
template <class Loader, bool kSave, bool kQuantised>
__global__ void swiglu_forward_kernel(bf16* out, const Loader gate_up, int N, int F, float* out_amax,
                                      const Fp8GroupsOut save) {
  const int F8 = F / 8;
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned m = 0;
  if (idx < static_cast<size_t>(N) * F8) {
    const size_t n = idx / F8;
    const int j = static_cast<int>(idx % F8) * 8;
    const size_t at = n * 2 * F + j;
    float g[8], u[8];
    if constexpr (kSave || kQuantised) {
      static_assert(!Loader::kGroups, "the copy is cast from BF16 values");
      const x128 gb = load128cs(gate_up.x + at), ub = load128cs(gate_up.x + at + F);
      const Fp8GroupCast8 gq = fp8_groups_cast8(gb), uq = fp8_groups_cast8(ub);
      if constexpr (kSave) {
        fp8_groups_store8(save, gq, static_cast<int>(n), j, N, 2 * F);
        fp8_groups_store8(save, uq, static_cast<int>(n), F + j, N, 2 * F);
      }
      if constexpr (kQuantised) {
        fp8_groups_decode8(g, gq.codes, gq.d);  // Fp8GroupsLoader's values of the stored copy
        fp8_groups_decode8(u, uq.codes, uq.d);
      } else {
#pragma unroll
        for (int k = 0; k < 8; k++) g[k] = __bfloat162float(gb[k]), u[k] = __bfloat162float(ub[k]);
      }
    } else {
      gate_up.load8cs(g, at, static_cast<int>(n), j);
      gate_up.load8cs(u, at + F, static_cast<int>(n), F + j);
    }
    x128 y;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      y[k] = __float2bfloat16_rn(g[k] * sigmoid_device(g[k]) * u[k]);
      m = max(m, amax_bits(fabsf(__bfloat162float(y[k]))));
    }
    store128(out + n * F + j, y);
  }
  if (out_amax) block_atomic_max_amax(out_amax, m);
}

template <class Loader, bool kSave, bool kQuantised>
void launch_swiglu_forward(bf16* out, const Loader gate_up, int N, int F, cudaStream_t stream, float* out_amax,
                           const Fp8GroupsOut& save) {
  const size_t threads = static_cast<size_t>(N > 0 ? N : 0) * (F / 8);
  if (threads == 0) return;
  swiglu_forward_kernel<Loader, kSave, kQuantised>
      <<<ceil_div(threads, kSwigluBlock), kSwigluBlock, 0, stream>>>(out, gate_up, N, F, out_amax, save);
  CUDA_CHECK_LAUNCH();
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
                    const Fp8GroupsOut& save_gate_up, bool from_copy) {
  const char* kernel = "swiglu_forward";
  require_multiple_of_8(kernel, "F", F);
  require_aligned16(kernel, "out", out);
  require_aligned16(kernel, "gate_up", gate_up);
  if (save_gate_up.wanted())
    require_fp8_groups(kernel, "save_gate_up (F)", save_gate_up.codes, save_gate_up.scale_inv, F);
  else if (from_copy && F % kFp8GroupSize != 0)
    throw_error("%s: from_copy: F = %d is not a multiple of %d, the FP8 copy's group size", kernel, F,
                kFp8GroupSize);
  const Bf16Loader x{gate_up};
  if (save_gate_up.wanted() && from_copy)
    launch_swiglu_forward<Bf16Loader, true, true>(out, x, N, F, stream, out_amax, save_gate_up);
  else if (save_gate_up.wanted())
    launch_swiglu_forward<Bf16Loader, true, false>(out, x, N, F, stream, out_amax, save_gate_up);
  else if (from_copy)
    launch_swiglu_forward<Bf16Loader, false, true>(out, x, N, F, stream, out_amax, save_gate_up);
  else
    launch_swiglu_forward<Bf16Loader, false, false>(out, x, N, F, stream, out_amax, save_gate_up);
}

void swiglu_forward(bf16* out, const Fp8Groups& gate_up, int N, int F, cudaStream_t stream, float* out_amax) {
  const char* kernel = "swiglu_forward (fp8 input)";
  require_aligned16(kernel, "out", out);
  require_fp8_groups(kernel, "gate_up (F)", gate_up.codes, gate_up.scale_inv, F);
  launch_swiglu_forward<Fp8GroupsLoader, false, false>(out, fp8_groups_loader(gate_up, N), N, F, stream, out_amax,
                                                        Fp8GroupsOut{});
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
