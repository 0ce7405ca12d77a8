// llmc/kernels/gelu.cu: GELU with the tanh approximation (GPT-2, PyTorch approximate="tanh"), forward and in-place backward;
// kernels and CPU references. Any length n: full 8-element packs use 128-bit accesses, the last partial pack is scalar.
// The forward optionally writes the FP8 1x16 copy of its input (template kSave; the input seen as (rows, cols)) and
// optionally computes from that copy's values (kQuantised: COAT's FP8 flow, which the recomputation from the stored
// copy repeats bit for bit); forward and backward read the input through a loader (BF16 or the stored copy;
// llmc/kernels/fp8_groups.cuh): one copy of each algorithm.
#include <cmath>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/fp8_groups.cuh"
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
// inp: the loader of the input, seen as (rows, cols) (BF16, or a stored FP8 copy: the recomputation of kQuantised's
// output). kSave: the FP8 copy of the BF16 inp into save; kQuantised: out from the values of that copy (cast in
// registers, stored or not). A copy needs cols a multiple of 16 (so n % 8 == 0 and threads t, t ^ 1 hold the two
// halves of a group).
template <class Loader, bool kSave, bool kQuantised>
__global__ void gelu_forward_kernel(bf16* out, float* amax, const Loader inp, size_t n, const Fp8GroupsOut save,
                                    int rows, int cols) {
  constexpr bool kCopy = Loader::kGroups || kSave || kQuantised;
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  unsigned bits = 0;
  if (i + 8 <= n) {
    int row = 0, c = 0;
    if constexpr (kCopy) {
      row = static_cast<int>(i / cols);
      c = static_cast<int>(i - static_cast<size_t>(row) * cols);
    }
    float x[8];
    if constexpr (kSave || kQuantised) {
      static_assert(!Loader::kGroups, "the copy is cast from BF16 values");
      const x128 xb = load128cs(inp.x + i);
      const Fp8GroupCast8 q = fp8_groups_cast8(xb);
      if constexpr (kSave) fp8_groups_store8(save, q, row, c, rows, cols);
      if constexpr (kQuantised) {
        fp8_groups_decode8(x, q.codes, q.d);  // Fp8GroupsLoader's values of the stored copy
      } else {
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = __bfloat162float(xb[k]);
      }
    } else {
      inp.load8cs(x, i, row, c);
    }
    x128 y;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      y[k] = __float2bfloat16_rn(gelu_device(x[k]));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(y[k]))));
    }
    store128(out + i, y);
  } else if constexpr (!kCopy) {
    for (size_t j = i; j < n; j++) {
      out[j] = __float2bfloat16_rn(gelu_device(inp.load1(j)));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(out[j]))));
    }
  }
  if (amax != nullptr) {
    bits = warp_max_bits(bits);
    if (threadIdx.x % kWarpSize == 0) atomic_max_amax(amax, bits);
  }
}

// dinout (n) = dinout * gelu'(inp). inp: the loader of the input, seen as (n / cols, cols) (an FP8 copy needs row and
// column; with it n % 8 == 0 and the scalar tail never runs).
// amax (may be null): max |result| (one atomic per warp).
template <class Loader>
__global__ void gelu_backward_inplace_kernel(bf16* dinout, float* amax, const Loader inp, size_t n, int cols) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  unsigned bits = 0;
  if (i + 8 <= n) {
    int row = 0, c = 0;
    if constexpr (Loader::kGroups) {
      row = static_cast<int>(i / cols);
      c = static_cast<int>(i - static_cast<size_t>(row) * cols);
    }
    float x[8];
    inp.load8cs(x, i, row, c);
    x128 d = load128cs(dinout + i);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      d[k] = __float2bfloat16_rn(__bfloat162float(d[k]) * gelu_grad_device(x[k]));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(d[k]))));
    }
    store128(dinout + i, d);
  } else if constexpr (!Loader::kGroups) {
    for (size_t j = i; j < n; j++) {
      dinout[j] = __float2bfloat16_rn(__bfloat162float(dinout[j]) * gelu_grad_device(inp.load1(j)));
      bits = max(bits, amax_bits(fabsf(__bfloat162float(dinout[j]))));
    }
  }
  if (amax != nullptr) {
    bits = warp_max_bits(bits);
    if (threadIdx.x % kWarpSize == 0) atomic_max_amax(amax, bits);
  }
}

namespace {

// One thread per 8 elements: a kernel over (out, amax, inp, n, extra...), after the alignment checks every 16-byte
// access needs.
template <typename Kernel, typename Input, typename... Extra>
void launch_gelu(Kernel kernel, const char* name, const char* out_name, bf16* out, float* amax, const Input inp,
                 size_t n, cudaStream_t stream, Extra... extra) {
  require_aligned16(name, out_name, out);
  if (n == 0) return;
  const int block = 256;
  kernel<<<ceil_div(ceil_div(n, 8), block), block, 0, stream>>>(out, amax, inp, n, extra...);
  CUDA_CHECK_LAUNCH();
}

size_t gelu_fp8_elements(const char* kernel, int N, int C) {
  if (N < 0) throw_error("%s: N = %d must be >= 0", kernel, N);
  return static_cast<size_t>(N) * static_cast<size_t>(C);
}

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream, float* out_amax) {
  require_aligned16("gelu_forward", "inp", inp);
  launch_gelu(gelu_forward_kernel<Bf16Loader, false, false>, "gelu_forward", "out", out, out_amax, Bf16Loader{inp}, n,
              stream, Fp8GroupsOut{}, 0, 0);
}

void gelu_forward(bf16* out, const bf16* inp, int N, int C, cudaStream_t stream, float* out_amax,
                  const Fp8GroupsOut& save_inp, bool from_copy) {
  const char* kernel = "gelu_forward";
  require_aligned16(kernel, "inp", inp);
  const size_t n = gelu_fp8_elements(kernel, N, C);
  if (save_inp.wanted())
    require_fp8_groups(kernel, "save_inp (C)", save_inp.codes, save_inp.scale_inv, C);
  else if (from_copy && C % kFp8GroupSize != 0)
    throw_error("%s: from_copy: C = %d is not a multiple of %d, the FP8 copy's group size", kernel, C, kFp8GroupSize);
  const Bf16Loader x{inp};
  if (save_inp.wanted() && from_copy)
    launch_gelu(gelu_forward_kernel<Bf16Loader, true, true>, kernel, "out", out, out_amax, x, n, stream, save_inp, N, C);
  else if (save_inp.wanted())
    launch_gelu(gelu_forward_kernel<Bf16Loader, true, false>, kernel, "out", out, out_amax, x, n, stream, save_inp, N,
                C);
  else if (from_copy)
    launch_gelu(gelu_forward_kernel<Bf16Loader, false, true>, kernel, "out", out, out_amax, x, n, stream, save_inp, N,
                C);
  else
    launch_gelu(gelu_forward_kernel<Bf16Loader, false, false>, kernel, "out", out, out_amax, x, n, stream, save_inp, N,
                C);
}

void gelu_forward(bf16* out, const Fp8Groups& inp, int N, int C, cudaStream_t stream, float* out_amax) {
  const char* kernel = "gelu_forward (fp8 input)";
  const size_t n = gelu_fp8_elements(kernel, N, C);
  require_fp8_groups(kernel, "inp (C)", inp.codes, inp.scale_inv, C);
  launch_gelu(gelu_forward_kernel<Fp8GroupsLoader, false, false>, kernel, "out", out, out_amax,
              fp8_groups_loader(inp, N), n, stream, Fp8GroupsOut{}, N, C);
}

void gelu_backward_inplace(bf16* dinout, const bf16* inp, size_t n, cudaStream_t stream, float* dinp_amax) {
  require_aligned16("gelu_backward_inplace", "inp", inp);
  launch_gelu(gelu_backward_inplace_kernel<Bf16Loader>, "gelu_backward_inplace", "dinout", dinout, dinp_amax,
              Bf16Loader{inp}, n, stream, 0);
}

void gelu_backward_inplace(bf16* dinout, const Fp8Groups& inp, int N, int C, cudaStream_t stream, float* dinp_amax) {
  const char* kernel = "gelu_backward_inplace (fp8 input)";
  const size_t n = gelu_fp8_elements(kernel, N, C);
  require_fp8_groups(kernel, "inp (C)", inp.codes, inp.scale_inv, C);
  launch_gelu(gelu_backward_inplace_kernel<Fp8GroupsLoader>, kernel, "dinout", dinout, dinp_amax,
              fp8_groups_loader(inp, N), n, stream, C);
}

}  // namespace llmc
