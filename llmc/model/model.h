// llmc/model/model.h: the interface the trainer drives, whatever the architecture. One implementation per family
// (llmc/model/gpt2/gpt2.cu, llmc/model/llama/llama.cu), chosen by model.arch through make_model(); the trainer, the tests and the tools see
// only this class. The base owns what every family shares: the flat bf16 parameter buffer and the FP32 gradient
// buffer (both laid out by the ParamTable), the token / target / loss buffers, the mean-loss bookkeeping, the
// precision plan (llmc/precision/recipe) and the hook that tells data parallelism when a block's gradients are final.
//
// Use per training micro-step:  forward(inputs, targets, B, T, grad_scale = 1/(B*T*accum), s);  backward(s);
// per optimizer step the caller zeroes the gradients (zero_grads) before the first micro-step and calls
// weights_changed() after the optimizer wrote new weights (FP8 recipes re-quantise them once per step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/model/model_spec.h"
#include "llmc/precision/recipe.h"

namespace llmc {

using bf16 = __nv_bfloat16;
class PrecisionState;  // llmc/precision/linear.h

// Called during backward, on the compute stream, once the gradients of block `layer` are final for this micro-step
// (every later launch leaves them alone); layer = -1 once the embeddings and the final norm are final too (the last
// call of a backward). Data parallelism starts the reduction of those gradients from here.
using GradReadyHook = std::function<void(int layer, cudaStream_t stream)>;
// Data parallelism: reduces (MAX over ranks, in place) the `count` per-tensor amaxes a step recorded, before delayed
// scaling turns them into scales, so every rank keeps the same amax histories and scales.
using AmaxReducer = std::function<void(float* amax, int count, cudaStream_t stream)>;

class Model {
 public:
  virtual ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const ParamTable& table() const { return table_; }
  const PrecisionRecipe& recipe() const { return recipe_; }
  bf16* params() { return params_; }   // (table.total_elements) bf16 working weights
  float* grads() { return grads_; }    // (table.total_elements) FP32 gradients, accumulated by backward
  size_t activation_bytes() const { return activation_bytes_; }
  int max_batch() const { return B_max_; }
  int max_seq_len() const { return T_max_; }

  // h_inputs, h_targets: host (B, T) token ids; targets may be null (logits only) and may hold -1 (ignored token).
  // With targets the per-token losses are computed; if grad_scale > 0 the logits are turned into
  // dlogits * grad_scale in the same classifier pass (train step) and backward() may follow.
  // A forward with grad_scale == 0 (evaluation, sampling) runs the same quantisers as training but never updates
  // the recipe's scaling state.
  virtual void forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale,
                       cudaStream_t s) = 0;
  // After forward with grad_scale > 0: ACCUMULATES the parameter gradients into grads() (the caller zeroes them).
  virtual void backward(cudaStream_t s) = 0;
  // The weights in params() changed without an optimizer step (upload, resume): cached FP8 copies are stale.
  virtual void weights_changed() {}
  // After an optimizer step was applied: the weights changed, and delayed FP8 scaling turns the step's amaxes into
  // the next scales. Not called for a skipped step.
  virtual void end_step(cudaStream_t s) { weights_changed(); }
  // The FP8 scaling state (checkpoints, numerics telemetry); null for a model without FP8 linears.
  virtual PrecisionState* precision_state() { return nullptr; }

  // Mean per-token loss over the non-ignored targets of the last forward (synchronises the stream).
  float mean_loss(cudaStream_t s);
  // A step's loss summed on the device, so that the micro-steps need not wait for their forwards:
  // reset_step_loss() before the first micro-step, add_to_step_loss(weight) after each forward with targets adds
  // weight * its mean loss (as mean_loss() would return it, up to FP64 summation order), step_loss() waits for the
  // stream and returns the sum.
  void reset_step_loss(cudaStream_t s);
  void add_to_step_loss(double weight, cudaStream_t s);
  double step_loss(cudaStream_t s);
  // Per-token losses (B, T) FP32 of the last forward with targets (device memory).
  const float* losses() const { return losses_; }
  // (B, T, Vp) logits of the last forward when it ran with grad_scale == 0 (columns [V, Vp) are 0).
  const bf16* logits() const;
  void zero_grads(cudaStream_t s);
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }
  void set_amax_reducer(AmaxReducer reducer);

 protected:
  Model(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe);
  // Checks (B, T) against the plan and the token ids against the vocabulary, uploads inputs (and targets), records
  // the state of this forward. Every implementation's forward starts with it.
  void begin_forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s);
  // Every implementation's backward starts with it: checks that a training forward came first.
  void begin_backward() const;
  void grads_ready(int layer, cudaStream_t s) {
    if (grad_ready_) grad_ready_(layer, s);
  }

  ModelSpec spec_;
  ParamTable table_;
  PrecisionRecipe recipe_;
  int B_max_, T_max_, recompute_;

  bf16* params_ = nullptr;   // (total_elements)
  float* grads_ = nullptr;   // (total_elements)
  void* act_memory_ = nullptr;  // one allocation carved by the implementation's activation plan
  size_t activation_bytes_ = 0;
  int* inputs_ = nullptr;       // (B, T) token ids on the device (carved by the implementation)
  int* targets_ = nullptr;      // (B, T)
  bf16* logits_ = nullptr;      // (N, Vp) logits, or dlogits after a training forward
  float* losses_ = nullptr;     // (N)    per-token loss

  double* step_loss_ = nullptr;  // (1) device accumulator of add_to_step_loss
  int* h_upload_ = nullptr;      // (2, B_max * T_max) pinned staging of the inputs and targets of a forward
  cudaEvent_t uploaded_ = nullptr;  // recorded after the last upload read h_upload_

  // state of the last forward
  int last_B_ = 0, last_T_ = 0;
  bool last_has_targets_ = false;
  bool last_wrote_dlogits_ = false;
  std::vector<int> last_targets_;  // host copy, for the mean over non-ignored tokens
  GradReadyHook grad_ready_;
};

// Hands out 256-byte aligned pieces of one allocation (first pass: base = null, only counts the bytes). The models
// plan their activations with two passes: count, allocate, carve.
struct Carver {
  char* base = nullptr;
  size_t used = 0;
  template <typename Scalar>
  Scalar* take(size_t count) {
    used = (used + 255) / 256 * 256;
    Scalar* p = base ? reinterpret_cast<Scalar*>(base + used) : nullptr;
    used += count * sizeof(Scalar);
    return p;
  }
};

// The model of spec.arch ("gpt2", "llama") for micro-batches up to (B, T). recompute: 0 = keep every activation;
// 1 = recompute the cheap ones (norm outputs, activation-function outputs) in backward.
std::unique_ptr<Model> make_model(const ModelSpec& spec, int B, int T, int recompute,
                                  const PrecisionRecipe& recipe = PrecisionRecipe());

}  // namespace llmc
