// llmc/optim/adamw_update.cu: the AdamW update kernels on FP32 master weights, writing the bf16 working weights (round
// to nearest even): one element-wise body templated on the element-wise moment storages and one fused per-group body
// templated on the grouped ones (llmc/optim/moment_storage.cuh), and the clipping scale from the global norm
// (llmc/optim/adamw_update.h).
#include <cmath>

#include "llmc/core/common.h"
#include "llmc/core/cuda_utils.cuh"
#include "llmc/optim/adamw_math.cuh"
#include "llmc/optim/adamw_update.h"
#include "llmc/optim/moment_storage.cuh"

namespace llmc {

// W consecutive elements per thread: W = 4 uses 128-bit loads of master / grads (and of FP32 moments, 64-bit of
// BF16 ones) and a 64-bit store of the four bf16 params; W = 1 handles unaligned tensors and the tail.
template <typename T, int W>
struct alignas(sizeof(T) * W) Vec {
  T v[W];
};

template <class Storage, int W>
__global__ void adamw_kernel(float* master, bf16* params, const float* grads, typename Storage::Code* m,
                             typename Storage::Code* v, size_t num_vecs, AdamWStep step, const float* grad_scale) {
  using Code = typename Storage::Code;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_vecs) return;
  const float scale = *grad_scale;
  if (!isfinite(scale)) return;  // skipped step (non-finite gradient norm): master, m, v, params unchanged
  Vec<float, W> w = reinterpret_cast<const Vec<float, W>*>(master)[i];
  Vec<Code, W> mv = reinterpret_cast<const Vec<Code, W>*>(m)[i];
  Vec<Code, W> vv = reinterpret_cast<const Vec<Code, W>*>(v)[i];
  const Vec<float, W> g = reinterpret_cast<const Vec<float, W>*>(grads)[i];
  Vec<bf16, W> p;
#pragma unroll
  for (int k = 0; k < W; k++) {
    float mk = Storage::decode(mv.v[k]), vk = Storage::decode(vv.v[k]);
    adamw_element(w.v[k], mk, vk, g.v[k], scale, step);
    mv.v[k] = Storage::encode(mk);
    vv.v[k] = Storage::encode(vk);
    p.v[k] = __float2bfloat16_rn(w.v[k]);
  }
  reinterpret_cast<Vec<float, W>*>(master)[i] = w;
  reinterpret_cast<Vec<Code, W>*>(m)[i] = mv;
  reinterpret_cast<Vec<Code, W>*>(v)[i] = vv;
  reinterpret_cast<Vec<bf16, W>*>(params)[i] = p;
}

template <class Storage>
void launch_adamw(float* master, bf16* params, const float* grads, typename Storage::Code* m,
                  typename Storage::Code* v, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t, const float* grad_scale, cudaStream_t stream) {
  using Code = typename Storage::Code;
  const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, weight_decay, t);
  if (n == 0) return;
  const int block = 256;
  const bool vectorisable = is_aligned(master, 16) && is_aligned(grads, 16) && is_aligned(m, 4 * sizeof(Code)) &&
                            is_aligned(v, 4 * sizeof(Code)) && is_aligned(params, 8);
  size_t done = 0;
  if (vectorisable && n >= 4) {
    const size_t num_vecs = n / 4;
    adamw_kernel<Storage, 4><<<ceil_div(num_vecs, block), block, 0, stream>>>(master, params, grads, m, v, num_vecs,
                                                                              step, grad_scale);
    CUDA_CHECK_LAUNCH();
    done = 4 * num_vecs;
  }
  if (done < n) {
    const size_t rest = n - done;
    adamw_kernel<Storage, 1><<<ceil_div(rest, block), block, 0, stream>>>(
        master + done, params + done, grads + done, m + done, v + done, rest, step, grad_scale);
    CUDA_CHECK_LAUNCH();
  }
}

// One warp per group of kMomentGroupSize elements, kGroupsPerBlock groups per block (design in adamw_update.h).
constexpr int kGroupsPerBlock = 8;
constexpr int kPerLane = static_cast<int>(kMomentGroupSize) / kWarpSize;
constexpr unsigned kFullWarp = 0xffffffffu;

__device__ inline void warp_merge(GroupStats& s) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    s.merge(__shfl_xor_sync(kFullWarp, s.max_abs, offset), __shfl_xor_sync(kFullWarp, s.min_nonzero, offset));
}

template <class Storage>
__global__ void adamw_group_kernel(float* master, bf16* params, const float* grads, typename Storage::Code* m_codes,
                                   float* m_groups, typename Storage::Code* v_codes, float* v_groups, size_t n,
                                   size_t num_groups, AdamWStep step, const float* grad_scale) {
  constexpr int S = Storage::kScalesPerGroup;
  const size_t group = static_cast<size_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  if (group >= num_groups) return;  // the whole warp
  const float scale = *grad_scale;
  if (!isfinite(scale)) return;  // skipped step (non-finite gradient norm): master, m, v, params unchanged
  const size_t base = group * kMomentGroupSize;
  const int count = static_cast<int>(n - base < kMomentGroupSize ? n - base : kMomentGroupSize);
  const typename Storage::Group m_in = Storage::load(m_groups + group * S), v_in = Storage::load(v_groups + group * S);

  float w[kPerLane], mk[kPerLane], vk[kPerLane];
  GroupStats m_stats, v_stats;
  bool finite = true;
#pragma unroll
  for (int k = 0; k < kPerLane; k++) {
    const int i = lane + k * kWarpSize;
    if (i >= count) continue;
    w[k] = master[base + i];
    mk[k] = Storage::decode(m_codes[base + i], m_in);
    vk[k] = Storage::decode(v_codes[base + i], v_in);
    adamw_element(w[k], mk[k], vk[k], grads[base + i], scale, step);
    finite = finite && isfinite(w[k]) && isfinite(mk[k]) && isfinite(vk[k]);
    m_stats.add(mk[k]);
    v_stats.add(vk[k]);
  }
  if (!__all_sync(kFullWarp, finite)) return;  // a non-finite group writes nothing
  warp_merge(m_stats);
  warp_merge(v_stats);
  const typename Storage::Group m_out = Storage::fit(m_stats), v_out = Storage::fit(v_stats);
#pragma unroll
  for (int k = 0; k < kPerLane; k++) {
    const int i = lane + k * kWarpSize;
    if (i >= count) continue;
    master[base + i] = w[k];
    params[base + i] = __float2bfloat16_rn(w[k]);
    m_codes[base + i] = Storage::encode(mk[k], m_out);
    v_codes[base + i] = Storage::encode(vk[k], v_out);
  }
  if (lane == 0) {
    Storage::store(m_out, m_groups + group * S);
    Storage::store(v_out, v_groups + group * S);
  }
}

template <class Storage>
void launch_adamw_grouped(float* master, bf16* params, const float* grads, MomentView m, MomentView v, size_t n,
                          float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                          const float* grad_scale, cudaStream_t stream) {
  using Code = typename Storage::Code;
  const AdamWStep step = make_adamw_step(lr, beta1, beta2, eps, weight_decay, t);
  if (n == 0) return;
  if (!m.groups || !v.groups)
    throw_error("internal error: adamw_update of grouped moments without their group metadata");
  const size_t num_groups = ceil_div(n, kMomentGroupSize);
  adamw_group_kernel<Storage><<<ceil_div(num_groups, static_cast<size_t>(kGroupsPerBlock)),
                                kGroupsPerBlock * kWarpSize, 0, stream>>>(
      master, params, grads, static_cast<Code*>(m.codes), m.groups, static_cast<Code*>(v.codes), v.groups, n,
      num_groups, step, grad_scale);
  CUDA_CHECK_LAUNCH();
}

void adamw_update(float* master, bf16* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t, const float* grad_scale,
                  cudaStream_t stream) {
  launch_adamw<Fp32Moments>(master, params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale,
                            stream);
}

void adamw_update(float* master, bf16* params, const float* grads, bf16* m, bf16* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t, const float* grad_scale,
                  cudaStream_t stream) {
  launch_adamw<Bf16Moments>(master, params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale,
                            stream);
}

void adamw_update(const StateFormat& format, float* master, bf16* params, const float* grads, MomentView m,
                  MomentView v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                  const float* grad_scale, cudaStream_t stream) {
  switch (format.id) {
    case Fp32Moments::kFormat:
      launch_adamw<Fp32Moments>(master, params, grads, static_cast<float*>(m.codes), static_cast<float*>(v.codes), n,
                                lr, beta1, beta2, eps, weight_decay, t, grad_scale, stream);
      return;
    case Bf16Moments::kFormat:
      launch_adamw<Bf16Moments>(master, params, grads, static_cast<bf16*>(m.codes), static_cast<bf16*>(v.codes), n,
                                lr, beta1, beta2, eps, weight_decay, t, grad_scale, stream);
      return;
    case Fp8Moments::kFormat:
      launch_adamw_grouped<Fp8Moments>(master, params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                                       grad_scale, stream);
      return;
    case Fp8ExpandMoments::kFormat:
      launch_adamw_grouped<Fp8ExpandMoments>(master, params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                                             grad_scale, stream);
      return;
  }
  throw_error("internal error: adamw_update has no kernel for optimizer state format '%s'", format.name);
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
