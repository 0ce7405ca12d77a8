// llmc/optim/adamw.cu: AdamW (llmc/optim/adamw.h): state buffers, the clipped global norm and the per-tensor update, all
// launched on the caller's stream (the kernels are in adamw.cu and reduce.cu, declared in llmc/kernels/).
#include "llmc/optim/adamw.h"

#include "llmc/core/common.h"
#include "llmc/kernels/reduce.h"
#include "llmc/optim/adamw_update.h"

namespace llmc {

AdamW::AdamW(const ParamTable& table, double beta1, double beta2, double eps, double weight_decay)
    : n_(table.total_elements),
      beta1_((float)beta1),
      beta2_((float)beta2),
      eps_((float)eps),
      weight_decay_((float)weight_decay) {
  if (!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0)) {
    throw_error("AdamW: optimizer.beta1=%g and optimizer.beta2=%g must lie in [0, 1)", beta1, beta2);
  }
  if (!(eps > 0.0)) throw_error("AdamW: optimizer.eps=%g must be > 0", eps);
  for (const ParamInfo& p : table.params) segments_.push_back({p.offset, p.numel, p.weight_decay});
  const size_t bytes = n_ * sizeof(float);
  CUDA_CHECK(cudaMalloc(&master_, bytes));
  CUDA_CHECK(cudaMalloc(&m_, bytes));
  CUDA_CHECK(cudaMalloc(&v_, bytes));
  CUDA_CHECK(cudaMemset(master_, 0, bytes));
  CUDA_CHECK(cudaMemset(m_, 0, bytes));
  CUDA_CHECK(cudaMemset(v_, 0, bytes));
  CUDA_CHECK(cudaMalloc(&partials_, (size_t)global_norm_partials_per_tensor() * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&norm_, sizeof(float)));
  CUDA_CHECK(cudaMalloc(&grad_scale_, sizeof(float)));
  CUDA_CHECK(cudaMemset(norm_, 0, sizeof(float)));
}

AdamW::~AdamW() {
  cudaFree(grad_scale_);
  cudaFree(norm_);
  cudaFree(partials_);
  cudaFree(v_);
  cudaFree(m_);
  cudaFree(master_);
}

void AdamW::set_master(const float* host, bf16* params, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(master_, host, n_ * sizeof(float), cudaMemcpyHostToDevice, s));
  convert_float_to_bf16(params, master_, n_, s);
  CUDA_CHECK(cudaStreamSynchronize(s));  // the host array may be released when we return
}

void AdamW::step(bf16* params, const float* grads, float lr, int t, float grad_clip, cudaStream_t s) {
  if (t < 1) throw_error("AdamW::step: the step count t=%d must be 1-based", t);
  // Global norm over the whole gradient buffer in one launch (the tensors are contiguous; the padded vocabulary rows
  // of wte hold zeros): a fixed grid of partial sums, then their fixed-order sum. One launch instead of one per tensor.
  global_norm_squared(partials_, grads, n_, s);
  global_norm_finish(norm_, partials_, global_norm_partials_per_tensor(), s);
  clip_scale_from_norm(grad_scale_, norm_, grad_clip, s);
  for (const Segment& seg : segments_) {
    const size_t o = seg.offset;
    adamw_update(master_ + o, params + o, grads + o, m_ + o, v_ + o, seg.numel, lr, beta1_, beta2_, eps_,
                 seg.weight_decay ? weight_decay_ : 0.0f, t, grad_scale_, s);
  }
}

float AdamW::last_grad_norm(cudaStream_t s) {
  float norm = 0.0f;
  CUDA_CHECK(cudaMemcpyAsync(&norm, norm_, sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return norm;
}

void AdamW::download(float* master, float* m, float* v) const {
  const size_t bytes = n_ * sizeof(float);
  CUDA_CHECK(cudaMemcpy(master, master_, bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(m, m_, bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(v, v_, bytes, cudaMemcpyDeviceToHost));
}

void AdamW::upload(const float* master, const float* m, const float* v, bf16* params, cudaStream_t s) {
  const size_t bytes = n_ * sizeof(float);
  CUDA_CHECK(cudaMemcpyAsync(master_, master, bytes, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(m_, m, bytes, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(v_, v, bytes, cudaMemcpyHostToDevice, s));
  convert_float_to_bf16(params, master_, n_, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace llmc
