// llmc/precision/precision_state.h: the precision state a model's quantised linears share (class PrecisionState):
// every per-tensor scale / scale_inv / amax slot in contiguous device arrays (so delayed scaling updates all of them
// in one launch, and checkpoints save them as a few tensors), the amax histories, the quantised scratch shared by all
// linears (a linear's quantised x / dy live only during its own products), and the numerics telemetry. Constructed
// with DeviceMemory::Count, it and its linears only count the bytes they would allocate (the host-side memory plan of
// --dry-run, llmc/model/model.h plan_model_memory): the same constructors, no CUDA call.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "llmc/precision/quantize.h"
#include "llmc/precision/recipe.h"
#include "llmc/precision/tensor.h"

namespace llmc {

using bf16 = __nv_bfloat16;

class Linear;

// Whether the model, its linears and its precision state allocate their device memory, or only count it (no CUDA call:
// the memory plan of a run on a machine without a GPU).
enum class DeviceMemory { Allocate, Count };

// The device memory of the quantisation machinery, by what it holds (bytes; each the sum of the allocations that hold
// it, alignment included).
struct PrecisionMemory {
  size_t weight_caches = 0;   // every linear's quantised weight (and its transposed copy / block scales), per step
  size_t saved_inputs = 0;    // the linears' quantised inputs kept for the weight gradient (saved activations)
  size_t scratch = 0;         // the shared quantised operands (x, dy and their transposes) and their block scales,
                              // and the largest FP4 operand conversion of the GEMM layer (llmc/precision/gemm.h)
  size_t scaling = 0;         // per-tensor scale / scale_inv / amax slots, formats and the amax histories
  size_t total() const { return weight_caches + saved_inputs + scratch + scaling; }
};

// Scratch buffers shared by every linear (a linear's quantised operands live only during its own products).
enum ScratchId : int {
  kScratchRows = 0,      // Xq (M, K) in forward; dYq (M, N) in backward
  kScratchRowsT = 1,     // dYᵀq (N, M)
  kScratchInputT = 2,    // Xᵀq (K, M) quantised in backward when the input was not saved quantised
  kScratchWeightT = 3,   // Wᵀq (K, N) when the plan does not cache it (made by the weight cast, then in backward);
                         // Quartet's backward: the re-quantised weight codes (K, N) and their scales
  kScratchProduct = 4,   // Quartet's backward: the FP32 product (M, K) or (N, K) before its mask and inverse rotation
  kScratchWeight = 5,    // Wq (N, K) and its scales when the plan caches no weight (cache_weights false; Wᵀq and
                         // its scales then in kScratchWeightT)
  kScratchCount = 6,
};

// Telemetry of one quantised tensor at one step.
struct TensorNumerics {
  std::string name;   // "transformer.h.3.attn.c_attn.x" (x / w / dy), or a product's: "...c_attn.fprop" (fprop /
                      // dgrad / wgrad; product telemetry, set_product_numerics)
  QuantStats stats;
  bool product = false;  // a quantised product against the BF16 product of the unquantised operands
  // On the "x" entry of a linear whose products are MXFP4: how many 32-element blocks of its operands the exact E4M3
  // remap could not keep exactly (llmc/precision/fp4_gemm.h) since the previous report, over all its products; -1
  // elsewhere.
  long long inexact_blocks = -1;
};

// Which operand of a linear a random stream belongs to (stochastic rounding keys).
enum class LinearRole : int { X = 0, W = 1, Dy = 2 };

class PrecisionState {
 public:
  explicit PrecisionState(const PrecisionRecipe& recipe, DeviceMemory memory = DeviceMemory::Allocate);
  ~PrecisionState();
  PrecisionState(const PrecisionState&) = delete;
  PrecisionState& operator=(const PrecisionState&) = delete;

  const PrecisionRecipe& recipe() const { return recipe_; }
  // False for a state that only counts its memory (DeviceMemory::Count): it and its linears never touch the device.
  bool allocates() const { return memory_ == DeviceMemory::Allocate; }
  // Registers a linear (called by its constructor). All linears are created before the first forward.
  int add(Linear* linear);  // its index (registration order)
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
  // The random streams of stochastic rounding and of the random Hadamard signs (FP4 recipes): the run's seed and this
  // rank (of world_size; ranks draw different streams), and the 0-based optimizer step the following micro-steps
  // belong to (the session sets it before every step, so a resumed run draws what the uninterrupted one drew;
  // begin_backward counts the micro-steps of the step).
  void set_random_stream(uint64_t seed, int rank, int world_size);
  void begin_step(long long step);
  // The key of the random bits of `role` of the linear registered `index`-th, in the current micro-step: (seed, step,
  // a tensor number unique to (micro-step, rank, linear, role) within the step; fp4_rng.cuh).
  StochasticKey stochastic_key(int index, LinearRole role) const;
  // The run's random sign vector of a size-`size` Hadamard transform (one for every layer and step, as NVIDIA's
  // NVFP4 recipe keeps it).
  uint32_t hadamard_signs(int size) const;
  // Fresh random signs of a size-`size` Hadamard transform for `role` of the linear registered `index`-th in the
  // current micro-step (Quartet's re-randomised backward rotations): drawn from stochastic_key(index, role), in a
  // counter range of their own (fp4_rng.cuh's random_signs), so runs repeat and resume bit for bit.
  uint32_t rotation_signs(int index, LinearRole role, int size) const;
  // Telemetry: when requested, every quantisation of the following training forward/backward also measures its
  // numerics (once per tensor); collect_numerics() returns them (synchronises) and ends the request.
  void request_numerics() { numerics_requested_ = true; }
  bool numerics_requested() const { return numerics_requested_; }
  // Product telemetry (log.numerics_products): on the requested steps every quantised linear also measures its
  // fprop, dgrad and wgrad outputs against the BF16 products of the unquantised operands (one BF16 GEMM more per
  // product, into stream-ordered scratch freed after it). wgrad needs the layer's BF16 input, so it is measured only
  // where backward receives one (precision.fp8_activations = false, or the attention projection).
  void set_product_numerics(bool on) { product_numerics_ = on; }
  bool product_numerics_requested() const { return numerics_requested_ && product_numerics_; }
  std::vector<TensorNumerics> collect_numerics(cudaStream_t s);

  // Checkpointed state (delayed scaling: scales, amax histories, ring position). describe() names the slots;
  // download gives scales = [scale (n) | scale_inv (n)] and history (n, history_len); upload checks the description
  // against this run (a different recipe or model is a clear error).
  int num_slots() const { return static_cast<int>(slot_names_.size()); }
  // Device memory of the quantisation machinery: every linear's cached quantised weight and saved quantised input,
  // the shared scratch and the scaling arrays (planned sizes; allocated at the first forward).
  size_t device_bytes() const;
  // The same bytes by what they hold (the memory plan's precision-state, saved-activation and scratch terms).
  PrecisionMemory memory() const;
  nlohmann::json describe() const;
  void download(std::vector<float>* scales, std::vector<float>* history) const;
  void upload(const nlohmann::json& description, const std::vector<float>& scales, const std::vector<float>& history);

 private:
  friend class Linear;
  // Byte offsets of the pieces of the one allocation of ensure_allocated, and its size.
  struct Layout {
    size_t scale = 0, scale_inv = 0, amax = 0, formats = 0, history = 0;
    std::vector<size_t> scratch, scales;  // (kScratchCount)
    size_t slot_bytes = 0;                // the slot arrays and histories (up to the first scratch buffer)
    size_t bytes = 0;
  };
  Layout layout() const;
  int new_slot(const std::string& name, ElementFormat f);
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
  // rotation: q's data copy was quantised from x rotated (quant_stats measures the rotated values); mxfp4_scale: the
  // rule of its MXFP4 block scales (the multiplier of the clipped count).
  void record_numerics(const std::string& name, const QTensor& q, const bf16* x, cudaStream_t s,
                       const HadamardOption& rotation = HadamardOption(), Mxfp4Scale mxfp4_scale = Mxfp4Scale::Amax);
  // A product's numerics: got against ref (n elements each; product_error_stats), recorded as `name`.
  template <class T>
  void record_product_numerics(const std::string& name, const T* got, const T* ref, size_t n, cudaStream_t s);
  double* numerics_slot(const std::string& name);  // the stats slot of a new record, or null (recorded already / full)

  PrecisionRecipe recipe_;
  DeviceMemory memory_;
  std::vector<Linear*> linears_;
  std::vector<std::string> slot_names_;
  std::vector<uint8_t> slot_formats_;
  bool allocated_ = false;
  void* device_memory_ = nullptr;  // one allocation for everything below
  float* scale_ = nullptr;         // (padded_slots) quantisation multipliers
  float* scale_inv_ = nullptr;     // (padded_slots)
  float* amax_ = nullptr;          // (padded_slots) amax slots (+ the spare)
  uint8_t* formats_ = nullptr;     // (padded_slots) ElementFormat of each slot
  float* history_ = nullptr;       // (padded_slots, history_len) delayed scaling ring buffers
  int history_len_ = 1;
  int history_pos_ = 0;
  long long steps_recorded_ = 0;
  std::function<void(float*, int, cudaStream_t)> amax_reducer_;
  uint64_t seed_ = 0;
  int rank_ = 0, world_size_ = 1;
  long long step_ = 0;
  long long micro_ = -1;  // micro-steps of step_ begun (begin_backward), minus one
  std::vector<size_t> scratch_bytes_, scratch_floats_;
  std::vector<uint8_t*> scratch_ptrs_;
  std::vector<float*> scratch_scale_ptrs_;
  bool numerics_requested_ = false;
  bool product_numerics_ = false;
  std::vector<std::string> numerics_names_;
  std::vector<bool> numerics_products_;  // per record: a product's
  double* numerics_ = nullptr;  // (capacity, kQuantStatsSlots)
  int numerics_capacity_ = 0;
};

}  // namespace llmc
