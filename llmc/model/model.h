// llmc/model/model.h: the interface the trainer drives, whatever the architecture, and the machinery every family's GPU
// model shares. One implementation per family (llmc/model/<arch>/, registered in llmc/model/family.h), made by
// make_model(); the trainer, the tests and the tools see only this class. The base owns: the flat bf16 parameter
// buffer and the FP32 gradient buffer (both laid out by the ParamTable) and their named views (ParamViews); the
// token / target / loss buffers and the mean-loss bookkeeping; the precision state its linears share and their
// creation from the recipe (make_linear); the activation memory, laid out in two passes (plan_activations) with one
// rule for the inputs backward does not read in BF16 (input_buffer); the producer-amax options of the linears
// (x_from_producer, dy_from_producer); the weight-change protocol (weights_changed, end_step); the embedding's
// backward plan; and the hook that tells data parallelism when a block's gradients are final.
//
// Use per training micro-step:  forward(inputs, targets, B, T, grad_scale = 1/(B*T*accum), s);  backward(s);
// per optimizer step the caller zeroes the gradients (zero_grads) before the first micro-step and calls
// end_step() after the optimizer wrote new weights (FP8 recipes re-quantise them once per step).
//
// Memory plan: a model constructed with DeviceMemory::Count runs the same constructors (parameter table, linears and
// their precision state, the family's activation plan) but allocates nothing and makes no CUDA call; memory() then
// gives the bytes an allocating model of the same arguments holds (plan_model_memory, for --dry-run).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/core/common.h"
#include "llmc/kernels/encoder.h"
#include "llmc/kernels/fp8_groups.h"
#include "llmc/model/model_spec.h"
#include "llmc/precision/linear.h"
#include "llmc/precision/recipe.h"

namespace llmc {

using bf16 = __nv_bfloat16;

// Called during backward, on the compute stream, once the gradients of block `layer` are final for this micro-step
// (every later launch leaves them alone); layer = -1 once the embeddings and the final norm are final too (the last
// call of a backward). Data parallelism starts the reduction of those gradients from here.
using GradReadyHook = std::function<void(int layer, cudaStream_t stream)>;
// Data parallelism: reduces (MAX over ranks, in place) the `count` per-tensor amaxes a step recorded, before delayed
// scaling turns them into scales, so every rank keeps the same amax histories and scales.
using AmaxReducer = std::function<void(float* amax, int count, cudaStream_t stream)>;

// What a piece of the activation memory holds (a family says it while it carves, Carver::use).
enum class ActivationUse : int {
  Saved = 0,    // read by backward: block inputs and outputs, norm statistics, attention outputs and LSE
  Logits = 1,   // the logits (dlogits after a training forward) and the per-token losses
  Working = 2,  // token ids, forward buffers backward does not read, backward's gradient buffers, reduction scratch
};
constexpr int kActivationUses = 3;

// A tensor that a non-linear layer (a norm, GELU, SwiGLU) reads in backward: its BF16 values and, under the recipe's
// nonlinear_fp8 (COAT's FP8 activations), the FP8 1x16 group copy (llmc/kernels/fp8_groups.h) that the producer
// writes beside them in a training forward. With a copy, backward reads the copy, and the BF16 values live in a buffer
// that later forward work overwrites; without one, the values are the block's own and backward reads them.
struct SavedActivation {
  bf16* values = nullptr;  // (rows, cols)
  Fp8GroupsOut copy;       // codes (rows, cols) and scale_inv, or none
  // Where a producer writes the copy: none outside training (nothing will read it).
  Fp8GroupsOut copy_out(bool train) const { return train ? copy : Fp8GroupsOut{}; }
  // The copy as the backward kernels read it (when copy.wanted()).
  Fp8Groups copy_view() const { return {copy.codes, copy.scale_inv}; }
  // Calls read(x) with what backward reads: x is Fp8Groups (the copy) or const bf16* (the values), so one call
  // site reaches the kernel overload of either form.
  template <typename Read>
  void read(Read&& read) const {
    if (copy.wanted())
      read(copy_view());
    else
      read(static_cast<const bf16*>(values));
  }
};

// The device memory of a model, by what it holds (bytes, alignment included).
struct ModelMemory {
  size_t weights = 0;                      // bf16 working weights: the whole parameter table
  size_t gradients = 0;                    // FP32 gradients of the whole table (reduced in place under ZeRO-1)
  size_t activations[kActivationUses] = {};  // the one activation allocation, by ActivationUse
  PrecisionMemory precision;               // the linears' quantised weights and saved inputs, scratch, scaling state
  size_t activation(ActivationUse use) const { return activations[static_cast<int>(use)]; }
  size_t total() const;
};

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
  // The device memory this model holds once its first training step has run (the precision state allocates at the
  // first forward); for a DeviceMemory::Count model, what it would hold.
  ModelMemory memory() const;
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
  void weights_changed() { precision_.weights_changed(); }
  // After an optimizer step was applied: the weights changed, and delayed FP8 scaling turns the step's amaxes into
  // the next scales. Not called for a skipped step.
  void end_step(cudaStream_t s) { precision_.end_step(s); }
  // The scaling state every linear of the model shares (checkpoints, numerics telemetry).
  PrecisionState* precision_state() { return &precision_; }

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
  // Hands out 256-byte aligned pieces of one allocation (first pass: base = null, only counts the bytes), and
  // counts them by what they hold. Buffers that are never live at the same time may share memory: rewind(mark())
  // carves what follows over what was carved since the mark, and end_overlay() continues after the furthest buffer.
  // The allocation is `high` bytes; each byte is counted once, in bytes[use] of the take() that first reached it
  // (alignment included).
  struct Carver {
    char* base = nullptr;
    size_t used = 0;  // where the next buffer starts (before alignment)
    size_t high = 0;  // the end of the furthest buffer carved
    ActivationUse use = ActivationUse::Working;
    size_t bytes[kActivationUses] = {};
    template <typename Scalar>
    Scalar* take(size_t count) {
      used = (used + 255) / 256 * 256;
      Scalar* p = base ? reinterpret_cast<Scalar*>(base + used) : nullptr;
      used += count * sizeof(Scalar);
      if (used > high) {
        bytes[static_cast<int>(use)] += used - high;
        high = used;
      }
      return p;
    }
    size_t mark() const { return used; }
    void rewind(size_t mark) { used = mark; }
    void end_overlay() { used = high; }
  };

  // memory = DeviceMemory::Count: nothing is allocated, no CUDA call is made (the memory plan).
  Model(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe,
        DeviceMemory memory = DeviceMemory::Allocate);
  bool allocates() const { return memory_mode_ == DeviceMemory::Allocate; }
  // Checks (B, T) against the plan and the token ids against the vocabulary, uploads inputs (and targets), records
  // the state of this forward and starts the precision state's forward. Every implementation's forward starts with
  // it.
  void begin_forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s);
  // Every implementation's backward starts with it: checks that a training forward came first and starts the
  // precision state's backward.
  void begin_backward(cudaStream_t s);
  void grads_ready(int layer, cudaStream_t s) {
    if (grad_ready_) grad_ready_(layer, s);
  }

  // A linear of block `layer` (-1: outside the blocks) with its plan from the recipe, registered with the precision
  // state (every model creates its linears in one fixed order: the order names the scaling slots in checkpoints).
  // name: the parameter-table name of its weight without ".weight", or the name of a fused group
  // ("model.layers.3.self_attn.qkv_proj"), for telemetry, checkpoints and errors.
  std::unique_ptr<Linear> make_linear(const std::string& name, LinearKind kind, int layer, int out_features,
                                      int in_features);
  // The activation memory, planned once for (B_max, T_max): carve lays out every buffer of the family through the
  // Carver it is given (after inputs_ and targets_), setting Carver::use before each group of buffers. It runs twice,
  // counting the bytes and then carving the one allocation (once, counting, for a DeviceMemory::Count model); the
  // memory starts zeroed (a buffer that shares memory with another holds whatever that one last held).
  void plan_activations(const std::function<void(Carver&)>& carve);
  // Whether backward reads the BF16 input of `linear` (false when the linear saved an FP8 copy for its weight
  // gradient).
  static bool needs_bf16_input(const Linear& linear) { return !linear.saves_quantized_input(); }
  // Whether the working buffers that only the forward uses (outputs it consumes at once, shared by the blocks) and
  // those that only the backward uses (the gradients flowing through the blocks) may share memory: with recompute
  // off, backward writes no forward buffer and reads none in BF16 that it did not keep in a buffer of its own.
  bool forward_and_backward_overlay() const { return recompute_ == 0; }
  // Whether the block keeps the BF16 input of `consumer` in a buffer of its own: backward reads it and does not
  // recompute it.
  bool keeps_own_input(const Linear& consumer) const {
    return needs_bf16_input(consumer) && !recomputes_input(consumer);
  }
  // The buffer (count elements) every block overwrites with the BF16 input of the consumer `pick(block)` returns, when
  // at least one block keeps no such input of its own; null (nothing carved) when every block keeps its own, as under
  // BF16 without recompute.
  template <typename Blocks, typename Pick>
  bf16* shared_input_buffer(Carver& cv, const Blocks& blocks, Pick pick, size_t count) const {
    for (const auto& block : blocks)
      if (!keeps_own_input(pick(block))) return cv.take<bf16>(count);
    return nullptr;
  }
  // Where the forward writes the BF16 input of `consumer` (count elements): a buffer of the block's own when it keeps
  // one (keeps_own_input), else `shared` (shared_input_buffer's).
  bf16* input_buffer(Carver& cv, const Linear& consumer, bf16* shared, size_t count) const {
    if (keeps_own_input(consumer)) return cv.take<bf16>(count);
    if (cv.base != nullptr && shared == nullptr) throw_error("internal error: a linear's input has no shared buffer");
    return shared;
  }
  // A (rows, cols) tensor a non-linear layer reads in backward (carve it while cv.use is Saved). Under nonlinear_fp8
  // its values are `shared` (a buffer the caller carved as working memory, which other tensors overwrite in the
  // forward) and the FP8 copy is carved here; otherwise the values get a buffer of their own.
  SavedActivation saved_activation(Carver& cv, size_t rows, size_t cols, bf16* shared) const;
  // Whether backward recomputes the BF16 input of `consumer` (backward reads that input, and recompute is on, or the
  // input is the MLP activation that recompute_mlp_act recomputes from its input's FP8 copy).
  bool recomputes_input(const Linear& consumer) const {
    return needs_bf16_input(consumer) && (recompute_ != 0 || recomputes_mlp_act(consumer));
  }
  // Whether `consumer` is the MLP's down projection and its input, the GELU / SwiGLU output, is computed from the FP8
  // copy of the activation's input (precision.recompute_mlp_act), so that backward recomputes it from that copy
  // into the backward's own buffer (recomputed_act_: the forward's working buffers overlay the backward's).
  bool recomputes_mlp_act(const Linear& consumer) const {
    return recipe_.recompute_mlp_act && consumer.kind() == LinearKind::MlpDown;
  }
  // The BF16 input to hand the backward of `linear`: null when it saved an FP8 copy (the buffer may be shared).
  static const bf16* bf16_input(const Linear& linear, const bf16* x) { return needs_bf16_input(linear) ? x : nullptr; }
  // The options of a linear whose input x (forward) or output gradient dy (backward) comes from a kernel that also
  // wrote the tensor's amax into the linear's slot (x_amax_slot / dy_amax_slot; a linear without a slot reads no
  // amax, and its producer reports none).
  static Linear::ForwardOptions x_from_producer(const Linear& linear) {
    Linear::ForwardOptions opt;
    opt.x_amax_ready = linear.x_amax_slot() != nullptr;
    return opt;
  }
  static Linear::BackwardOptions dy_from_producer(const Linear& linear) {
    Linear::BackwardOptions opt;
    opt.dy_amax_ready = linear.dy_amax_slot() != nullptr;
    return opt;
  }

  ModelSpec spec_;
  ParamTable table_;
  PrecisionRecipe recipe_;
  int B_max_, T_max_, recompute_;
  DeviceMemory memory_mode_;
  PrecisionState precision_;  // before the families' linears: they register with it and are destroyed first

  bf16* params_ = nullptr;   // (total_elements)
  float* grads_ = nullptr;   // (total_elements)
  void* act_memory_ = nullptr;  // one allocation carved by plan_activations
  size_t activation_bytes_ = 0;
  size_t activation_bytes_by_use_[kActivationUses] = {};  // activation_bytes_ by ActivationUse
  int* inputs_ = nullptr;       // (B, T) token ids on the device
  int* targets_ = nullptr;      // (B, T)
  bf16* logits_ = nullptr;      // (N, Vp) logits, or dlogits after a training forward (carved by the family)
  float* losses_ = nullptr;     // (N)    per-token loss (carved by the family)
  EncoderBackwardPlan encoder_plan_;  // the token embedding's gradient plan, built by every training forward

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

// Named views of a flat buffer laid out by the parameter table (the bf16 weights or the FP32 gradients): a family
// fills its struct of tensor pointers through them, by the table's (Hugging Face) names.
template <typename Scalar>
class ParamViews {
 public:
  ParamViews(Scalar* base, const ParamTable& table) : base_(base), table_(table) {}
  // The tensor `name` (an llmc::Error names it when the table has none); null over a null base (a model that only
  // counts its memory).
  Scalar* operator()(const std::string& name) const {
    const size_t offset = table_.get(name).offset;
    return base_ ? base_ + offset : nullptr;
  }
  // One weight stored as the tensors `names`, back to back (a fused GEMM's q|k|v, gate|up): its first tensor, once
  // the layout the GEMM relies on is checked.
  Scalar* fused(const std::vector<std::string>& names) const {
    for (size_t i = 1; i < names.size(); i++) {
      const ParamInfo& prev = table_.get(names[i - 1]);
      if (prev.offset + prev.numel != table_.get(names[i]).offset)
        throw_error("parameter table: '%s' does not follow '%s' contiguously, so one fused GEMM cannot read them",
                    names[i].c_str(), names[i - 1].c_str());
    }
    return (*this)(names.front());
  }

 private:
  Scalar* base_;
  const ParamTable& table_;
};

// One pointer of a family's per-block struct and the tensor it views, by its name inside the block (several names: a
// fused weight, ParamViews::fused).
template <typename Block, typename Scalar>
struct BlockView {
  Scalar* Block::*member;
  std::vector<std::string> names;
  BlockView(Scalar* Block::*m, const char* name) : member(m), names{name} {}
  BlockView(Scalar* Block::*m, std::vector<std::string> fused) : member(m), names(std::move(fused)) {}
};

// The per-block structs of n_layer blocks whose tensors are named prefix + block index + "." + name
// ("transformer.h." gives "transformer.h.3.ln_1.weight").
template <typename Block, typename Scalar>
std::vector<Block> carve_blocks(const ParamViews<Scalar>& at, int n_layer, const std::string& prefix,
                                const std::vector<BlockView<Block, Scalar>>& views) {
  std::vector<Block> blocks(n_layer);
  for (int l = 0; l < n_layer; l++) {
    const std::string in_block = prefix + std::to_string(l) + ".";
    for (const BlockView<Block, Scalar>& v : views) {
      std::vector<std::string> names;
      for (const std::string& name : v.names) names.push_back(in_block + name);
      blocks[l].*v.member = at.fused(names);
    }
  }
  return blocks;
}

// The model of spec.arch (its family's factory, llmc/model/family.h) for micro-batches up to (B, T). recompute:
// 0 = keep every activation; 1 = recompute the cheap ones (norm outputs, activation-function outputs) in backward.
std::unique_ptr<Model> make_model(const ModelSpec& spec, int B, int T, int recompute,
                                  const PrecisionRecipe& recipe = PrecisionRecipe(),
                                  DeviceMemory memory = DeviceMemory::Allocate);

// The device memory make_model(spec, B, T, recompute, recipe) holds after its first training step: the model built
// with DeviceMemory::Count, its memory(). Host only (no GPU needed); throws what make_model would throw.
ModelMemory plan_model_memory(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe);

}  // namespace llmc
