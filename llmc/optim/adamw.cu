// llmc/optim/adamw.cu: AdamW over owned element ranges (llmc/optim/adamw.h): state buffers, the clipped global norm and
// the per-segment update, all launched on the caller's stream (the kernels are in llmc/optim/adamw_update.cu and
// llmc/kernels/reduce.cu).
#include "llmc/optim/adamw.h"

#include <algorithm>

#include "llmc/core/common.h"
#include "llmc/kernels/reduce.h"
#include "llmc/optim/adamw_update.h"

namespace llmc {

namespace {

std::vector<StateRange> whole_buffer(const ParamTable& table) { return {{{0, table.total_elements}, true}}; }

OptimizerConfig hyperparameters(double beta1, double beta2, double eps, double weight_decay) {
  OptimizerConfig c;
  c.beta1 = beta1;
  c.beta2 = beta2;
  c.eps = eps;
  c.weight_decay = weight_decay;
  return c;
}

void* device_zeros(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

}  // namespace

AdamW::AdamW(const ParamTable& table, double beta1, double beta2, double eps, double weight_decay)
    : AdamW(table, hyperparameters(beta1, beta2, eps, weight_decay), whole_buffer(table)) {}

AdamW::AdamW(const ParamTable& table, const OptimizerConfig& config, std::vector<StateRange> ranges)
    : ranges_(std::move(ranges)),
      format_(config.state_format),
      beta1_(static_cast<float>(config.beta1)),
      beta2_(static_cast<float>(config.beta2)),
      eps_(static_cast<float>(config.eps)),
      weight_decay_(static_cast<float>(config.weight_decay)) {
  if (!(config.beta1 >= 0.0 && config.beta1 < 1.0) || !(config.beta2 >= 0.0 && config.beta2 < 1.0))
    throw_error("AdamW: optimizer.beta1=%g and optimizer.beta2=%g must lie in [0, 1)", config.beta1, config.beta2);
  if (!(config.eps > 0.0)) throw_error("AdamW: optimizer.eps=%g must be > 0", config.eps);
  const size_t align = format_.shard_alignment(), total = table.total_elements;
  if (ParamTable::kAlign % align != 0)
    throw_error("internal error: optimizer.state_format = %s groups %zu elements, but tensors start at multiples of "
                "%zu", format_.name, align, ParamTable::kAlign);
  for (size_t i = 0; i < ranges_.size(); i++) {
    const StateRange& r = ranges_[i];
    const auto [b, e] = r.elements;
    if (b >= e || e > total)
      throw_error("internal error: optimizer range [%zu, %zu) is empty or outside the %zu parameters", b, e, total);
    // Only the last range may end inside a group (the partial last group of the buffer), so that every range starts
    // on a group boundary of the local storage as well.
    if (b % align != 0 || (e % align != 0 && (e != total || i + 1 != ranges_.size())))
      throw_error("optimizer.state_format = %s stores the moments in groups of %zu elements, but the optimizer range "
                  "[%zu, %zu) cuts a group: the shard layout must align to the groups", format_.name, align, b, e);
    // The tensors (in table order) inside the range, one segment each.
    for (const ParamInfo& p : table.params) {
      const size_t sb = std::max(b, p.offset), se = std::min(e, p.offset + p.numel);
      if (sb < se) segments_.push_back({sb, n_ + (sb - b), se - sb, p.weight_decay});
    }
    n_ += e - b;
  }
  master_ = static_cast<float*>(device_zeros(n_ * sizeof(float)));
  m_ = device_zeros(format_.m.bytes(n_));
  v_ = device_zeros(format_.v.bytes(n_));
  CUDA_CHECK(cudaMalloc(&partials_, num_norm_partials() * sizeof(float)));
  norm_ = static_cast<float*>(device_zeros(sizeof(float)));
  CUDA_CHECK(cudaMalloc(&grad_scale_, sizeof(float)));
}

AdamW::~AdamW() {
  cudaFree(grad_scale_);
  cudaFree(norm_);
  cudaFree(partials_);
  cudaFree(v_);
  cudaFree(m_);
  cudaFree(master_);
}

std::vector<ElementRange> AdamW::ranges() const {
  std::vector<ElementRange> out;
  for (const StateRange& r : ranges_) out.push_back(r.elements);
  return out;
}

size_t AdamW::num_norm_partials() const {
  return ranges_.size() * static_cast<size_t>(global_norm_partials_per_tensor());
}

void AdamW::set_master(const float* host_full, bf16* params, cudaStream_t s) {
  size_t local = 0;
  for (const StateRange& r : ranges_) {
    const auto [b, e] = r.elements;
    CUDA_CHECK(cudaMemcpyAsync(master_ + local, host_full + b, (e - b) * sizeof(float), cudaMemcpyHostToDevice, s));
    convert_float_to_bf16(params + b, master_ + local, e - b, s);
    local += e - b;
  }
  CUDA_CHECK(cudaStreamSynchronize(s));  // the host array may be released when we return
}

void AdamW::step(bf16* params, const float* grads, float lr, int t, float grad_clip, cudaStream_t s) {
  if (t < 1) throw_error("AdamW::step: the step count t=%d must be 1-based", t);
  const float* partials = norm_partials(grads, s);
  clipped_update(params, grads, partials, num_norm_partials(), lr, t, grad_clip, s);
}

// One launch per range (the tensors of a range are contiguous; the alignment gaps and the padded vocabulary rows of
// wte hold zeros): a fixed grid of partial sums each.
const float* AdamW::norm_partials(const float* grads, cudaStream_t s) {
  const size_t P = static_cast<size_t>(global_norm_partials_per_tensor());
  for (size_t i = 0; i < ranges_.size(); i++) {
    const auto [b, e] = ranges_[i].elements;
    float* out = partials_ + i * P;
    if (ranges_[i].adds_to_norm)
      global_norm_squared(out, grads + b, e - b, s);
    else
      CUDA_CHECK(cudaMemsetAsync(out, 0, P * sizeof(float), s));
  }
  return partials_;
}

void AdamW::clipped_update(bf16* params, const float* grads, const float* partials, size_t count, float lr, int t,
                           float grad_clip, cudaStream_t s) {
  if (t < 1) throw_error("AdamW::step: the step count t=%d must be 1-based", t);
  global_norm_finish(norm_, partials, static_cast<int>(count), s);
  clip_scale_from_norm(grad_scale_, norm_, grad_clip, s);
  // One launch per segment: a segment starts on a group boundary (tensors start at multiples of ParamTable::kAlign,
  // ranges at multiples of the shard alignment) and the rest of its last group is an alignment gap no segment holds.
  for (const Segment& seg : segments_)
    adamw_update(format_, master_ + seg.local, params + seg.global, grads + seg.global,
                 moment_view(format_.m, m_, n_, seg.local), moment_view(format_.v, v_, n_, seg.local), seg.numel, lr,
                 beta1_, beta2_, eps_, seg.weight_decay ? weight_decay_ : 0.0f, t, grad_scale_, s);
}

float AdamW::last_grad_norm(cudaStream_t s) {
  float norm = 0.0f;
  CUDA_CHECK(cudaMemcpyAsync(&norm, norm_, sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return norm;
}

void AdamW::download(std::vector<float>* master, StoredMoments* moments) const {
  master->resize(n_);
  moments->format = format_;
  moments->m.resize(format_.m.bytes(n_));
  moments->v.resize(format_.v.bytes(n_));
  CUDA_CHECK(cudaMemcpy(master->data(), master_, n_ * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(moments->m.data(), m_, moments->m.size(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(moments->v.data(), v_, moments->v.size(), cudaMemcpyDeviceToHost));
}

void AdamW::restore(const float* master_full, const StoredMoments& moments, bf16* params, cudaStream_t s) {
  if (moments.format != format_ || moments.m.size() != format_.m.bytes(n_) || moments.v.size() != format_.v.bytes(n_))
    throw_error("internal error: AdamW::restore got %zu / %zu bytes of %s moments for %zu elements of %s state",
                moments.m.size(), moments.v.size(), moments.format.name, n_, format_.name);
  CUDA_CHECK(cudaMemcpyAsync(m_, moments.m.data(), moments.m.size(), cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(v_, moments.v.data(), moments.v.size(), cudaMemcpyHostToDevice, s));
  set_master(master_full, params, s);  // synchronises
}

}  // namespace llmc
