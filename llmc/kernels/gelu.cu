// llmc/kernels/gelu.cu: GELU with the tanh approximation (GPT-2, PyTorch approximate="tanh"), forward and in-place backward;
// kernels and CPU references. Any length n: full 8-element packs use 128-bit accesses, the last partial pack is scalar.
#include <cmath>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/gelu.h"

namespace llmc {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
__device__ inline float gelu_device(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
// gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
__device__ inline float gelu_grad_device(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float tanh_u = tanhf(u);
  const float sech2_u = 1.0f - tanh_u * tanh_u;
  return 0.5f * (1.0f + tanh_u) + 0.5f * x * sech2_u * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// out (n) = gelu(inp). One thread per pack of 8 elements; the pack at n/8 (if n % 8 != 0) is done element by element.
// amax (may be null): max |out| (one atomic per warp). Every thread reaches the end (no early return).
__global__ void gelu_forward_kernel(bf16* out, float* amax, const bf16* inp, size_t n) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  unsigned bits = 0;
  if (i + 8 <= n) {
    const x128 x = load128cs(inp + i);
    x128 y;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      y[k] = __float2bfloat16_rn(gelu_device(__bfloat162float(x[k])));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(y[k]))));
    }
    store128(out + i, y);
  } else {
    for (size_t j = i; j < n; j++) {
      out[j] = __float2bfloat16_rn(gelu_device(__bfloat162float(inp[j])));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(out[j]))));
    }
  }
  if (amax != nullptr) {
    bits = warp_max_bits(bits);
    if (threadIdx.x % kWarpSize == 0) atomic_max_amax(amax, bits);
  }
}

// dinout (n) = dinout * gelu'(inp).
// amax (may be null): max |result| (one atomic per warp).
__global__ void gelu_backward_inplace_kernel(bf16* dinout, float* amax, const bf16* inp, size_t n) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  unsigned bits = 0;
  if (i + 8 <= n) {
    const x128 x = load128cs(inp + i);
    x128 d = load128cs(dinout + i);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      d[k] = __float2bfloat16_rn(__bfloat162float(d[k]) * gelu_grad_device(__bfloat162float(x[k])));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(d[k]))));
    }
    store128(dinout + i, d);
  } else {
    for (size_t j = i; j < n; j++) {
      dinout[j] = __float2bfloat16_rn(__bfloat162float(dinout[j]) * gelu_grad_device(__bfloat162float(inp[j])));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(dinout[j]))));
    }
  }
  if (amax != nullptr) {
    bits = warp_max_bits(bits);
    if (threadIdx.x % kWarpSize == 0) atomic_max_amax(amax, bits);
  }
}

namespace {

// One thread per 8 elements: both kernels over (out, amax, inp, n), after the alignment checks every 16-byte access
// needs.
template <typename Kernel>
void launch_gelu(Kernel kernel, const char* name, const char* out_name, bf16* out, float* amax, const bf16* inp,
                 size_t n, cudaStream_t stream) {
  require_aligned16(name, out_name, out);
  require_aligned16(name, "inp", inp);
  if (n == 0) return;
  const int block = 256;
  kernel<<<ceil_div(ceil_div(n, 8), block), block, 0, stream>>>(out, amax, inp, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream, float* out_amax) {
  launch_gelu(gelu_forward_kernel, "gelu_forward", "out", out, out_amax, inp, n, stream);
}

void gelu_backward_inplace(bf16* dinout, const bf16* inp, size_t n, cudaStream_t stream, float* dinp_amax) {
  launch_gelu(gelu_backward_inplace_kernel, "gelu_backward_inplace", "dinout", dinout, dinp_amax, inp, n, stream);
}

}  // namespace llmc
