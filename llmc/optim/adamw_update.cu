// llmc/optim/adamw_update.cu: the AdamW update kernel on FP32 master weights with FP32 moments, writing the bf16
// working weights (round to nearest even), and the clipping scale from the global norm (llmc/optim/adamw_update.h).
#include <cmath>

#include "llmc/core/cuda_utils.cuh"
#include "llmc/optim/adamw_math.cuh"
#include "llmc/optim/adamw_update.h"

namespace llmc {

// W consecutive elements per thread: W = 4 uses 128-bit loads of master / grads / m / v and a 64-bit store of the
// four bf16 params; W = 1 handles unaligned tensors and the tail.
template <int W>
struct alignas(sizeof(float) * W) FloatVec {
  float v[W];
};
template <int W>
struct alignas(sizeof(bf16) * W) Bf16Vec {
  bf16 v[W];
};

template <int W>
__global__ void adamw_kernel(float* master, bf16* params, const float* grads, float* m, float* v, size_t num_vecs,
                             AdamWStep step, const float* grad_scale) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_vecs) return;
  const float scale = *grad_scale;
  if (!isfinite(scale)) return;  // skipped step (non-finite gradient norm): master, m, v, params unchanged
  FloatVec<W> w = reinterpret_cast<const FloatVec<W>*>(master)[i];
  FloatVec<W> mv = reinterpret_cast<const FloatVec<W>*>(m)[i];
  FloatVec<W> vv = reinterpret_cast<const FloatVec<W>*>(v)[i];
  const FloatVec<W> g = reinterpret_cast<const FloatVec<W>*>(grads)[i];
  Bf16Vec<W> p;
#pragma unroll
  for (int k = 0; k < W; k++) {
    adamw_element(w.v[k], mv.v[k], vv.v[k], g.v[k], scale, step);
    p.v[k] = __float2bfloat16_rn(w.v[k]);
  }
  reinterpret_cast<FloatVec<W>*>(master)[i] = w;
  reinterpret_cast<FloatVec<W>*>(m)[i] = mv;
  reinterpret_cast<FloatVec<W>*>(v)[i] = vv;
  reinterpret_cast<Bf16Vec<W>*>(params)[i] = p;
}

void adamw_update(float* master, bf16* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t, const float* grad_scale,
                  cudaStream_t stream) {
  const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, weight_decay, t);
  if (n == 0) return;
  const int block = 256;
  const bool vectorisable = is_aligned(master, 16) && is_aligned(grads, 16) && is_aligned(m, 16) &&
                            is_aligned(v, 16) && is_aligned(params, 8);
  size_t done = 0;
  if (vectorisable && n >= 4) {
    const size_t num_vecs = n / 4;
    adamw_kernel<4><<<ceil_div(num_vecs, block), block, 0, stream>>>(master, params, grads, m, v, num_vecs, step,
                                                                     grad_scale);
    CUDA_CHECK_LAUNCH();
    done = 4 * num_vecs;
  }
  if (done < n) {
    const size_t rest = n - done;
    adamw_kernel<1><<<ceil_div(rest, block), block, 0, stream>>>(master + done, params + done, grads + done, m + done,
                                                                 v + done, rest, step, grad_scale);
    CUDA_CHECK_LAUNCH();
  }
}

// grad_scale[0] = (clip > 0 && norm > clip) ? clip / norm : 1, on the device (no host sync). A non-finite norm (an
// overflow somewhere in the gradients) gives grad_scale = NaN, which makes every AdamW launch of this step return
// without touching anything: the divergence guard's skipped step.
__global__ void clip_scale_kernel(float* grad_scale, const float* norm, float clip) {
  const float n = norm[0];
  grad_scale[0] = !isfinite(n) ? __int_as_float(0x7fc00000) : (clip > 0.0f && n > clip) ? clip / n : 1.0f;
}

void clip_scale_from_norm(float* grad_scale, const float* norm, float clip, cudaStream_t stream) {
  clip_scale_kernel<<<1, 1, 0, stream>>>(grad_scale, norm, clip);
  CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
