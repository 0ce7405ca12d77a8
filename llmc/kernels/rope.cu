// llmc/kernels/rope.cu: rotary position embeddings (Llama, Hugging Face "rotate_half" convention) applied in place to the query
// and key heads of a packed qkv, forward and backward (the inverse rotation); kernels and CPU references.
//
// For a head vector v (HS) at position t, with half = HS/2 and i in [0, half):
//   inv_freq[i] = theta^(-2i/HS)   (computed in FP64, rounded to FP32: the same FP32 value on host and device)
//   angle = fl32(t * inv_freq[i]),  c = cos(angle), s = sin(angle)   (FP32 on the GPU)
//   forward:  v'[i] = v[i] c - v[i+half] s;     v'[i+half] = v[i+half] c + v[i] s
//   backward: dv[i] = dv'[i] c + dv'[i+half] s;  dv[i+half] = dv'[i+half] c - dv'[i] s   (the transpose)
// The rotation angles depend only on (t, i), so each thread computes its 8 (cos, sin) pairs once and applies them to
// a group of heads.
#include <cmath>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/kernels/rope.h"

namespace llmc {

namespace {

constexpr int kRopeHeadsPerThread = 8;  // heads one thread rotates with the same (cos, sin) (blockIdx.y = group)
constexpr int kRopeBlock = 256;

// One thread per (token n, 8 consecutive frequencies i0 .. i0+7, group of heads). It rotates the pairs
// (i0 .. i0+7, i0+half .. i0+half+7) of the q/k heads of its group; heads past NH + NKV are value heads, only read for
// the amax (backward with amax). qkv (N, (NH + 2*NKV) * HS).
template <bool kBackward>
__global__ void rope_kernel(bf16* qkv, int T, int N, int NH, int NKV, int HS, float theta, float* amax) {
  const int chunks = HS / 16;  // 8-frequency chunks per head
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int rotated_heads = NH + NKV;
  const int last_head = amax ? NH + 2 * NKV : rotated_heads;
  const int head_begin = blockIdx.y * kRopeHeadsPerThread;
  const int head_end = min(last_head, head_begin + kRopeHeadsPerThread);
  unsigned m = 0;
  if (idx < static_cast<size_t>(N) * chunks && head_begin < head_end) {
    const int n = static_cast<int>(idx / chunks);
    const int i0 = static_cast<int>(idx % chunks) * 8;
    const int half = HS / 2;
    const float t = static_cast<float>(n % T);
    float c[8], s[8];
    if (head_begin < rotated_heads) {
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const float inv_freq = static_cast<float>(pow(static_cast<double>(theta), -2.0 * (i0 + k) / HS));
        sincosf(t * inv_freq, &s[k], &c[k]);
      }
    }
    bf16* row = qkv + static_cast<size_t>(n) * (NH + 2 * NKV) * HS;
    for (int h = head_begin; h < head_end; h++) {
      bf16* lo_ptr = row + static_cast<size_t>(h) * HS + i0;
      bf16* hi_ptr = lo_ptr + half;
      x128 lo = load128(lo_ptr), hi = load128(hi_ptr);
      if (h < rotated_heads) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
          const float a = __bfloat162float(lo[k]), b = __bfloat162float(hi[k]);
          if (kBackward) {
            lo[k] = __float2bfloat16_rn(a * c[k] + b * s[k]);
            hi[k] = __float2bfloat16_rn(b * c[k] - a * s[k]);
          } else {
            lo[k] = __float2bfloat16_rn(a * c[k] - b * s[k]);
            hi[k] = __float2bfloat16_rn(b * c[k] + a * s[k]);
          }
        }
        store128(lo_ptr, lo);
        store128(hi_ptr, hi);
      }
      if (amax) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
          m = max(m, amax_bits(fabsf(__bfloat162float(lo[k]))));
          m = max(m, amax_bits(fabsf(__bfloat162float(hi[k]))));
        }
      }
    }
  }
  if (amax) block_atomic_max_amax(amax, m);
}

template <bool kBackward>
void launch_rope(const char* kernel, bf16* qkv, int B, int T, int NH, int NKV, int HS, float theta,
                 cudaStream_t stream, float* amax) {
  if (HS <= 0 || HS % 16 != 0)
    throw_error("%s: head size %d must be a positive multiple of 16 (rotate_half pairs 8-element chunks of each "
                "half)", kernel, HS);
  if (NH <= 0 || NKV <= 0 || NH % NKV != 0)
    throw_error("%s: n_head = %d must be a positive multiple of n_kv_head = %d", kernel, NH, NKV);
  if (!(theta > 0.0f)) throw_error("%s: theta = %g must be positive (model.rope_theta)", kernel, (double)theta);
  require_aligned16(kernel, "qkv", qkv);
  const int N = B * T;
  if (N <= 0) return;
  const int heads = amax ? NH + 2 * NKV : NH + NKV;
  const size_t threads = static_cast<size_t>(N) * (HS / 16);
  const dim3 grid(static_cast<unsigned>(ceil_div(threads, kRopeBlock)),
                  static_cast<unsigned>(ceil_div(heads, kRopeHeadsPerThread)));
  rope_kernel<kBackward><<<grid, kRopeBlock, 0, stream>>>(qkv, T, N, NH, NKV, HS, theta, amax);
  CUDA_CHECK_LAUNCH();
}


}  // namespace

void rope_forward(bf16* qkv, int B, int T, int NH, int NKV, int HS, float theta, cudaStream_t stream) {
  launch_rope<false>("rope_forward", qkv, B, T, NH, NKV, HS, theta, stream, nullptr);
}

void rope_backward(bf16* dqkv, int B, int T, int NH, int NKV, int HS, float theta, cudaStream_t stream,
                   float* dqkv_amax) {
  launch_rope<true>("rope_backward", dqkv, B, T, NH, NKV, HS, theta, stream, dqkv_amax);
}

}  // namespace llmc
