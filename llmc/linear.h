// llmc/linear: one linear layer's three products (fprop, dgrad, wgrad) under its precision plan (llmc/recipe), and
// the model-wide precision state they share. Every model (gpt2, llama) runs every linear through this module, so a
// recipe applies to all of them the same way.
//
//   BF16 plan: cuBLASLt BF16 GEMMs with FP32 accumulation (llmc/gemm), bias / GELU_AUX / DGELU epilogues.
//   FP8 plan:  x, w, dy quantised per the plan (llmc/quant) and multiplied with the TN FP8 GEMMs of llmc/gemm:
//              fprop Y = Xq·Wqᵀ, dgrad dX = dYq·(Wᵀq)ᵀ, wgrad dW += dYᵀq·(Xᵀq)ᵀ. The weight is quantised once per
//              optimizer step (with its transposed copy) and reused by every micro-step; the input is saved for
//              wgrad as its transposed FP8 copy when the plan says so (the model then keeps no BF16 copy of it).
//
// PrecisionState owns, for the whole model: every per-tensor scale / scale_inv / amax slot in contiguous device arrays
// (so delayed scaling updates all of them in one launch, and checkpoints save them as a few tensors), the amax
// histories, the FP8 scratch shared by all linears (a linear's quantised x / dy live only during its own products),
// and the telemetry buffers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "llmc/quant.h"
#include "llmc/recipe.h"
#include "llmc/tensor.h"

namespace llmc {

using bf16 = __nv_bfloat16;

class PrecisionState;

class Linear {
 public:
  // name: the weight's parameter-table name without ".weight" (e.g. "transformer.h.3.attn.c_attn"), used in
  // telemetry, checkpoints and errors. out_features N, in_features K; max_rows = the largest M (B*T) it will see.
  Linear(PrecisionState& state, std::string name, LinearKind kind, int layer, int out_features, int in_features,
         const LinearPlan& plan, int max_rows);
  ~Linear();
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  const std::string& name() const { return name_; }
  const LinearPlan& plan() const { return plan_; }
  bool fp8() const { return plan_.fp8; }
  // True when backward needs no BF16 copy of the input (it was saved as FP8 in forward).
  bool saves_fp8_input() const { return plan_.fp8 && plan_.save_fp8_input; }
  // Device slots that the kernel producing x (forward) or dy (backward) fills with max |value| (current per-tensor
  // FP8 scaling only; null otherwise: the producer then skips it). Zeroed by PrecisionState::begin_forward /
  // begin_backward.
  float* x_amax_slot() const;
  float* dy_amax_slot() const;

  // out (M, N) = x (M, K) · wᵀ (+ bias (N)). training: save what backward needs and record amaxes for delayed
  // scaling (false for evaluation / sampling: the same quantisers run, nothing is recorded).
  struct ForwardOptions {
    bf16* pre_gelu = nullptr;   // GELU: pre_gelu (M, N) = x·wᵀ + bias and out = gelu_tanh(pre_gelu)
    bool x_amax_ready = false;  // the kernel that produced x filled x_amax_slot() (else the layer measures it)
    float* out_amax = nullptr;  // report max |out| here (the next linear's x slot), or null
    // out = residual + x·wᵀ + bias, added in the GEMM (one rounding), when adds_residual(); residual (M, N) and out
    // must be distinct buffers. Not with pre_gelu.
    const bf16* residual = nullptr;
  };
  // Whether forward can add a residual inside its product (BF16 plans: the GEMM's C operand). FP8 plans cannot (the
  // caller adds it, e.g. in the LayerNorm kernel that follows).
  bool adds_residual() const { return !plan_.fp8; }
  void forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int M, bool training, cudaStream_t s,
               const ForwardOptions& opt);
  void forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int M, bool training, cudaStream_t s) {
    forward(out, x, w, bias, M, training, s, ForwardOptions());
  }
  // dx (M, K) = dy (M, N) · w (overwritten, or added to dx with accumulate_dx); dw (N, K) FP32 += dyᵀ · x.
  // x: the BF16 input of the forward (may be null when saves_fp8_input()). dx may be null (not wanted).
  struct BackwardOptions {
    bool accumulate_dx = false;
    const bf16* x_pre_gelu = nullptr;  // x = gelu(x_pre_gelu): dx is the gradient w.r.t. x_pre_gelu instead
    bool dy_amax_ready = false;        // the kernel that produced dy filled dy_amax_slot()
    float* dx_amax = nullptr;          // report max |dx| here (the previous linear's dy slot), or null
  };
  void backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w, int M, cudaStream_t s,
                const BackwardOptions& opt);
  void backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w, int M, cudaStream_t s) {
    backward(dx, dw, dy, x, w, M, s, BackwardOptions());
  }
  // The weights changed: the next forward re-quantises them.
  void weights_changed() { weight_cache_valid_ = false; }

 private:
  friend class PrecisionState;
  PrecisionState& state_;
  std::string name_;
  LinearKind kind_;
  int layer_, N_, K_, max_rows_;
  LinearPlan plan_;
  // Quantises src (q.rows, q.cols) into q: block scales, or the per-tensor slot's scale (current / delayed).
  void quantize(QTensor& q, int slot, const bf16* src, bool amax_ready, bool training, cudaStream_t s);
  // FP8 operands. Per-tensor slots index into the PrecisionState arrays (-1 = none).
  int x_slot_ = -1, w_slot_ = -1, dy_slot_ = -1;
  QTensor wq_;         // (N, K) weight codes + transposed copy (K, N), cached per optimizer step
  QTensor x_saved_;    // (M_max, K) input: only data_t (K, M) kept for wgrad when save_fp8_input
  bool weight_cache_valid_ = false;
  bool weight_cache_recorded_ = false;  // the cache was built by a training forward (its amax recorded)
  bool have_saved_input_ = false;
  int saved_rows_ = 0;
  void* memory_ = nullptr;  // one allocation for wq_ and x_saved_
  size_t memory_bytes_ = 0;
};

// Telemetry of one quantised tensor at one step.
struct TensorNumerics {
  std::string name;   // "transformer.h.3.attn.c_attn.x" (x / w / dy)
  QuantStats stats;
};

class PrecisionState {
 public:
  explicit PrecisionState(const PrecisionRecipe& recipe);
  ~PrecisionState();
  PrecisionState(const PrecisionState&) = delete;
  PrecisionState& operator=(const PrecisionState&) = delete;

  const PrecisionRecipe& recipe() const { return recipe_; }
  // Registers a linear (called by its constructor). All linears are created before the first forward.
  void add(Linear* linear);
  // Before a forward / backward: zeroes the producer amax slots (current scaling).
  void begin_forward(cudaStream_t s);
  void begin_backward(cudaStream_t s);
  // After an optimizer step that was applied: the weights changed (every linear re-quantises its weight), and delayed
  // scaling records the step's amaxes (MAX-reduced over ranks by the reducer, if set) into the histories and computes
  // new scales, one launch for all tensors.
  void end_step(cudaStream_t s);
  // The weights changed without a step (upload, resume).
  void weights_changed();
  // A step the divergence guard skipped: the amaxes it recorded for delayed scaling are dropped.
  void discard_step(cudaStream_t s);
  void set_amax_reducer(std::function<void(float*, int, cudaStream_t)> reducer) { amax_reducer_ = std::move(reducer); }
  // Telemetry: when requested, every quantisation of the following training forward/backward also measures its
  // numerics (once per tensor); collect_numerics() returns them (synchronises) and ends the request.
  void request_numerics() { numerics_requested_ = true; }
  bool numerics_requested() const { return numerics_requested_; }
  std::vector<TensorNumerics> collect_numerics(cudaStream_t s);

  // Checkpointed state (delayed scaling: scales, amax histories, ring position). describe() names the slots;
  // download gives scales = [scale (n) | scale_inv (n)] and history (n, history_len); upload checks the description
  // against this run (a different recipe or model is a clear error).
  int num_slots() const { return static_cast<int>(slot_names_.size()); }
  // Device memory of the FP8 machinery: every linear's cached FP8 weight and saved FP8 input, the shared scratch and
  // the scaling arrays (planned sizes; allocated at the first forward).
  size_t device_bytes() const;
  nlohmann::json describe() const;
  void download(std::vector<float>* scales, std::vector<float>* history) const;
  void upload(const nlohmann::json& description, const std::vector<float>& scales, const std::vector<float>& history);

 private:
  friend class Linear;
  int new_slot(const std::string& name, Fp8Format f);
  void reserve(int which, size_t bytes, size_t scale_floats);  // scratch a linear needs at its largest M
  void ensure_allocated();  // on first use, once every linear is registered
  uint8_t* scratch(int which);
  float* scratch_scales(int which);
  // Slot i lives at index kSlotStride * i of the device arrays: cuBLASLt wants every scale pointer 16-byte aligned.
  // The entries in between are inert (amax 0 keeps their scale at 1 in the delayed update).
  static constexpr int kSlotStride = 4;
  float* scale_ptr(int slot) { return scale_ + kSlotStride * slot; }
  float* scale_inv_ptr(int slot) { return scale_inv_ + kSlotStride * slot; }
  float* amax_ptr(int slot) const { return amax_ + kSlotStride * slot; }
  float* temp_amax() { return amax_ + kSlotStride * slot_names_.size(); }  // the spare slot (delayed's first step)
  size_t padded_slots() const { return kSlotStride * (slot_names_.size() + 1); }
  bool history_started() const { return steps_recorded_ > 0; }
  void record_numerics(const std::string& name, const QTensor& q, const bf16* x, cudaStream_t s);

  PrecisionRecipe recipe_;
  std::vector<Linear*> linears_;
  std::vector<std::string> slot_names_;
  std::vector<uint8_t> slot_formats_;
  bool allocated_ = false;
  void* device_memory_ = nullptr;  // one allocation for everything below
  float* scale_ = nullptr;         // (padded_slots) quantisation multipliers
  float* scale_inv_ = nullptr;     // (padded_slots)
  float* amax_ = nullptr;          // (padded_slots) amax slots (+ the spare)
  uint8_t* formats_ = nullptr;     // (padded_slots) Fp8Format of each slot
  float* history_ = nullptr;       // (padded_slots, history_len) delayed scaling ring buffers
  int history_len_ = 1;
  int history_pos_ = 0;
  long long steps_recorded_ = 0;
  std::function<void(float*, int, cudaStream_t)> amax_reducer_;
  std::vector<size_t> scratch_bytes_, scratch_floats_;
  std::vector<uint8_t*> scratch_ptrs_;
  std::vector<float*> scratch_scale_ptrs_;
  bool numerics_requested_ = false;
  std::vector<std::string> numerics_names_;
  double* numerics_ = nullptr;  // (capacity, kQuantStatsSlots)
  int numerics_capacity_ = 0;
};

}  // namespace llmc
