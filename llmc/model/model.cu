// llmc/model/model.cu: what every architecture shares (llmc/model/model.h): the parameter / gradient buffers, the checks
// and uploads at the start of a forward (through pinned staging), the mean loss over non-ignored targets (on the host
// per forward, or summed on the device over a step), the linears' creation, the two-pass activation plan, and
// make_model(), which asks the family of model.arch for its model.
#include "llmc/model/model.h"

#include <algorithm>

#include "llmc/core/common.h"
#include "llmc/kernels/classifier.h"
#include "llmc/model/family.h"
#include "llmc/precision/gemm.h"
#include "llmc/precision/group_quant.h"

namespace llmc {

size_t ModelMemory::total() const {
  size_t bytes = weights + gradients + precision.total();
  for (size_t a : activations) bytes += a;
  return bytes;
}

Model::Model(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe, DeviceMemory memory)
    : spec_(spec), table_(build_param_table(spec)), recipe_(recipe), B_max_(B), T_max_(T), recompute_(recompute),
      memory_mode_(memory), precision_(recipe, memory) {
  if (B <= 0 || T <= 0) throw_error("model: micro-batch B=%d and sequence length T=%d must be positive", B, T);
  if (T > spec.max_seq_len)
    throw_error("model: train.seq_len=%d exceeds the context length model.max_seq_len=%d", T, spec.max_seq_len);
  if (recompute != 0 && recompute != 1) throw_error("model: train.recompute must be 0 or 1 (got %d)", recompute);
  if (recipe.nonlinear_fp8) {
    if (recompute != 0)
      throw_error("model: precision.nonlinear_fp8 keeps the norm and GELU / SwiGLU inputs only as FP8 copies, from "
                  "which train.recompute = 1 cannot recompute: set train.recompute to 0");
    const int group = kNonlinearFp8Groups.cols;
    if (spec.n_embd % group != 0 || spec.ffn_hidden % group != 0)
      throw_error("model: precision.nonlinear_fp8 needs model.n_embd (%d) and model.ffn_hidden (%d) to be multiples "
                  "of %d", spec.n_embd, spec.ffn_hidden, group);
  }
  if (!allocates()) return;
  gemm_init();
  CUDA_CHECK(cudaMalloc(&params_, table_.total_elements * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&grads_, table_.total_elements * sizeof(float)));
  CUDA_CHECK(cudaMemset(params_, 0, table_.total_elements * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(grads_, 0, table_.total_elements * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&step_loss_, sizeof(double)));
  CUDA_CHECK(cudaMemset(step_loss_, 0, sizeof(double)));
  CUDA_CHECK(cudaMallocHost(&h_upload_, 2 * static_cast<size_t>(B) * T * sizeof(int)));
  CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
}

Model::~Model() {
  if (!allocates()) return;  // nothing was allocated
  encoder_plan_.free();
  if (uploaded_) {
    cudaEventSynchronize(uploaded_);
    cudaEventDestroy(uploaded_);
  }
  cudaFreeHost(h_upload_);
  cudaFree(step_loss_);
  cudaFree(act_memory_);
  cudaFree(grads_);
  cudaFree(params_);
}

ModelMemory Model::memory() const {
  ModelMemory m;
  m.weights = table_.total_elements * sizeof(bf16);
  m.gradients = table_.total_elements * sizeof(float);
  for (int i = 0; i < kActivationUses; i++) m.activations[i] = activation_bytes_by_use_[i];
  m.precision = precision_.memory();
  return m;
}

const bf16* Model::logits() const {
  if (last_wrote_dlogits_) {
    throw_error("model: the last forward ran with grad_scale > 0, so the logits buffer now holds dlogits; run "
                "forward with grad_scale = 0 to read logits");
  }
  return logits_;
}

void Model::zero_grads(cudaStream_t s) {
  CUDA_CHECK(cudaMemsetAsync(grads_, 0, table_.total_elements * sizeof(float), s));
}

void Model::begin_forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale,
                          cudaStream_t s) {
  if (!allocates()) throw_error("internal error: a model built with DeviceMemory::Count (a memory plan) cannot run");
  if (B <= 0 || T <= 0 || B > B_max_ || T > T_max_)
    throw_error("model forward: batch (B=%d, T=%d) outside the planned (B <= %d, T <= %d)", B, T, B_max_, T_max_);
  if (grad_scale > 0.0f && h_targets == nullptr)
    throw_error("model forward: a training forward (grad_scale > 0) needs targets");
  const int N = B * T, V = spec_.vocab_size;
  for (int i = 0; i < N; i++) {
    if (h_inputs[i] < 0 || h_inputs[i] >= V)
      throw_error("model forward: input token %d at position %d is outside the vocabulary [0, %d)", h_inputs[i], i,
                  V);
    if (h_targets && (h_targets[i] < -1 || h_targets[i] >= V))
      throw_error("model forward: target %d at position %d is outside [0, %d) (or -1 = ignore)", h_targets[i], i, V);
  }
  // Through pinned staging: a copy from pageable memory makes the host wait for the stream, which would drain the
  // GPU at every micro-step. The previous upload has long finished reading the staging (it ran at the start of the
  // previous forward); the event makes sure.
  CUDA_CHECK(cudaEventSynchronize(uploaded_));
  std::copy(h_inputs, h_inputs + N, h_upload_);
  CUDA_CHECK(cudaMemcpyAsync(inputs_, h_upload_, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
  if (h_targets) {
    std::copy(h_targets, h_targets + N, h_upload_ + N);
    CUDA_CHECK(cudaMemcpyAsync(targets_, h_upload_ + N, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    last_targets_.assign(h_targets, h_targets + N);
  }
  CUDA_CHECK(cudaEventRecord(uploaded_, s));
  last_B_ = B;
  last_T_ = T;
  last_has_targets_ = h_targets != nullptr;
  last_wrote_dlogits_ = grad_scale > 0.0f;
  precision_.begin_forward(s);
}

void Model::begin_backward(cudaStream_t s) {
  if (!last_wrote_dlogits_)
    throw_error("model backward: call forward with targets and grad_scale > 0 first (the dlogits come from it)");
  precision_.begin_backward(s);
}

std::unique_ptr<Linear> Model::make_linear(const std::string& name, LinearKind kind, int layer, int out_features,
                                           int in_features) {
  return std::make_unique<Linear>(precision_, name, kind, layer, out_features, in_features,
                                  plan_linear(recipe_, layer, spec_.n_layer, kind), B_max_ * T_max_);
}

SavedActivation Model::saved_activation(Carver& cv, size_t rows, size_t cols, bf16* shared) const {
  SavedActivation a;
  if (!recipe_.nonlinear_fp8) {
    a.values = cv.take<bf16>(rows * cols);
    return a;
  }
  if (cv.base != nullptr && shared == nullptr) throw_error("internal error: a saved activation has no shared buffer");
  const int r = static_cast<int>(rows), c = static_cast<int>(cols);
  a.values = shared;
  a.copy.codes = cv.take<uint8_t>(fp8_groups_code_bytes(r, c));
  a.copy.scale_inv = cv.take<float>(fp8_groups_scale_bytes(r, c) / sizeof(float));
  return a;
}

void Model::plan_activations(const std::function<void(Carver&)>& carve) {
  const size_t N = static_cast<size_t>(B_max_) * T_max_;
  for (int pass = 0; pass < (allocates() ? 2 : 1); pass++) {
    Carver cv;
    if (pass == 1) {
      CUDA_CHECK(cudaMalloc(&act_memory_, activation_bytes_));
      cv.base = static_cast<char*>(act_memory_);
    }
    inputs_ = cv.take<int>(N);
    targets_ = cv.take<int>(N);
    carve(cv);
    activation_bytes_ = round_up(cv.high, 256);
    std::copy(cv.bytes, cv.bytes + kActivationUses, activation_bytes_by_use_);
    activation_bytes_by_use_[static_cast<int>(ActivationUse::Working)] += activation_bytes_ - cv.high;  // the end
  }
  if (allocates()) CUDA_CHECK(cudaMemset(act_memory_, 0, activation_bytes_));
}

float Model::mean_loss(cudaStream_t s) {
  if (!last_has_targets_) throw_error("model: mean_loss needs a forward with targets");
  const int N = last_B_ * last_T_;
  std::vector<float> h_losses(N);
  CUDA_CHECK(cudaMemcpyAsync(h_losses.data(), losses_, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return static_cast<float>(mean_loss_host(h_losses.data(), last_targets_.data(), N));
}

void Model::reset_step_loss(cudaStream_t s) { CUDA_CHECK(cudaMemsetAsync(step_loss_, 0, sizeof(double), s)); }

void Model::add_to_step_loss(double weight, cudaStream_t s) {
  if (!last_has_targets_) throw_error("model: add_to_step_loss needs a forward with targets");
  accumulate_mean_loss(step_loss_, losses_, targets_, last_B_ * last_T_, weight, s);
}

double Model::step_loss(cudaStream_t s) {
  double total = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&total, step_loss_, sizeof(double), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return total;
}

void Model::set_amax_reducer(AmaxReducer reducer) { precision_.set_amax_reducer(std::move(reducer)); }

std::unique_ptr<Model> make_model(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe,
                                  DeviceMemory memory) {
  return model_family(spec.arch).make_model(spec, B, T, recompute, recipe, memory);
}

ModelMemory plan_model_memory(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe) {
  return make_model(spec, B, T, recompute, recipe, DeviceMemory::Count)->memory();
}

}  // namespace llmc
