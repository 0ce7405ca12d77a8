// llmc/precision/linear.h: one linear layer's three products (fprop, dgrad, wgrad) under its precision plan
// (llmc/precision/recipe.h), with the model-wide precision state it shares (llmc/precision/precision_state.h). Every
// model family runs every linear through this class, so a recipe applies to all of them the same way.
//
//   BF16 plan:      cuBLASLt BF16 GEMMs with FP32 accumulation (llmc/precision/gemm), bias / GELU_AUX / DGELU
//                   epilogues.
//   quantised plan: x, w, dy quantised with the plan's encodings (llmc/precision/quantize) and multiplied with the TN
//                   quantised GEMMs of llmc/precision/gemm: fprop Y = Xq·Wqᵀ, dgrad dX = dYq·(Wᵀq)ᵀ, wgrad
//                   dW += dYᵀq·(Xᵀq)ᵀ. The weight is quantised once per optimizer step (with its transposed copy) and
//                   reused by every micro-step; the input is saved for wgrad as its transposed quantised copy when
//                   the plan says so (the model then keeps no BF16 copy of it). FP4 plans (NVFP4, MXFP4) take the
//                   same path with packed E2M1 codes: the output gradients may be rounded stochastically and the two
//                   weight-gradient operands rotated by a random Hadamard transform along the tokens (the plan's
//                   dy_stochastic_rounding and wgrad_hadamard), and the products run exactly on Hopper's BF16 or FP8
//                   tensor cores (llmc/precision/fp4_gemm.h).
//   Quartet plan (requantize_backward; MXFP4 x, w, dy): the forward quantises x and w along K (fixed Hadamard-32,
//                   Gaussian or amax scales, trust masks) and keeps those codes: Xq (M, K) as the saved input, Wq
//                   (N, K) as the weight cache. The backward decodes them and re-quantises them, with dy, along the
//                   other direction of each product (fresh random Hadamard-32 signs, range-matched scales, RTN or
//                   SR); each product (x16/9) is masked with the forward's trust mask and rotated back along K.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "llmc/precision/gemm.h"
#include "llmc/precision/precision_state.h"
#include "llmc/precision/quantize.h"
#include "llmc/precision/recipe.h"
#include "llmc/precision/tensor.h"

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
  LinearKind kind() const { return kind_; }
  bool quantized() const { return plan_.quantized; }
  // True when backward needs no BF16 copy of the input (it was saved quantised in forward).
  bool saves_quantized_input() const { return plan_.quantized && plan_.save_quantized_input; }
  // Device slots that the kernel producing x (forward) or dy (backward) fills with max |value| (current per-tensor
  // scaling only; null otherwise: the producer then skips it). Zeroed by PrecisionState::begin_forward /
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
  // Whether forward can add a residual inside its product (BF16 plans: the GEMM's C operand). Quantised plans cannot
  // (the caller adds it, e.g. in the LayerNorm kernel that follows).
  bool adds_residual() const { return !plan_.quantized; }
  void forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int M, bool training, cudaStream_t s,
               const ForwardOptions& opt);
  void forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int M, bool training, cudaStream_t s) {
    forward(out, x, w, bias, M, training, s, ForwardOptions());
  }
  // dx (M, K) = dy (M, N) · w (overwritten, or added to dx with accumulate_dx); dw (N, K) FP32 += dyᵀ · x.
  // x: the BF16 input of the forward (may be null when saves_quantized_input()). dx may be null (not wanted).
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
  int index_ = -1;  // registration order in the precision state (names its random streams)
  // Quantises src (q.rows, q.cols) into q as operand `role`: block scales (with the plan's rounding and, on the
  // transposed copy of x and dy, its wgrad Hadamard transform), or the per-tensor slot's scale (current / delayed).
  void quantize_operand(QTensor& q, int slot, const bf16* src, bool amax_ready, bool training, LinearRole role,
                        cudaStream_t s, uint32_t* trust_mask = nullptr);
  // cache_weights = false: w quantised into the shared scratch (kScratchWeight, kScratchWeightT), with the codes a
  // cache would hold; wq_ / wq_t_ point there until another linear's cast overwrites them.
  void quantize_weight_into_scratch(const bf16* w, bool training, cudaStream_t s);
  // The quantiser arguments of a block-scaled operand `role` (rounding, random key, Hadamard transform of data_t;
  // Quartet's forward: its rotation, scale rule and trust mask, written to trust_mask when non-null).
  QuantizeArgs block_args(LinearRole role, const QTensor& q, uint32_t* trust_mask = nullptr) const;
  // Quartet's forward rotation of x and w along K (HadamardOption{} when the plan has none): the fixed H32, or H32
  // with the run's random signs (precision.forward_signs); the backward's epilogue undoes the same rotation.
  HadamardOption forward_rotation() const;
  // Quartet's forward MXFP4 scale rule of x and w (Gaussian with plan_.forward_gaussian_scales; Amax otherwise and
  // for every other plan).
  Mxfp4Scale forward_mxfp4_scale() const;
  // Quartet's backward (plan_.requantize_backward): dx (M, K) and dw (N, K) += from the saved Xq, Wq and dy.
  void backward_requantized(bf16* dx, float* dw, const bf16* dy, int M, cudaStream_t s, const BackwardOptions& opt);
  // The GEMM options every quantised product of this layer starts from (the MXFP4 inexact-block counter).
  QuantGemmOptions gemm_options() const;
  // FP4 plans: the FP32 decode scales of every NVFP4 copy this layer makes (kTensorScaleSlots, in memory_) and the
  // device counter of its MXFP4 products' inexact blocks (in memory_); null otherwise.
  enum TensorScaleSlot : int { kTsWeight, kTsWeightT, kTsSavedInputT, kTsInput, kTsDy, kTsDyT, kTsInputT,
                               kTensorScaleSlots };
  float* tensor_scales_ = nullptr;
  unsigned long long* inexact_blocks_ = nullptr;
  // Quantised operands. Per-tensor slots index into the PrecisionState arrays (-1 = none).
  int x_slot_ = -1, w_slot_ = -1, dy_slot_ = -1;
  QTensor wq_;         // (N, K) weight codes + transposed copy (K, N), cached per optimizer step (or in scratch)
  QTensor wq_t_;       // the transposed copy instead, when its encoding differs from the row codes' (split_weight_)
  bool split_weight_ = false;
  QTensor x_saved_;    // (M_max, K) input: only data_t (K, M) kept for wgrad when save_quantized_input (Quartet
                       // plans: only data (M, K), the forward's own codes)
  uint32_t* w_mask_ = nullptr;  // Quartet with trust masks: Wq's (N, K / 32 words), in the weight cache
  uint32_t* x_mask_ = nullptr;  // and the saved Xq's (M_max, K / 32 words)
  bool weight_cache_valid_ = false;  // quantised since the weights last changed (without a cache: its telemetry taken)
  bool weight_cache_recorded_ = false;  // the cache was built by a training forward (its amax recorded)
  bool have_saved_input_ = false;
  int saved_rows_ = 0;
  void* memory_ = nullptr;  // one allocation for wq_ and x_saved_ (none when the state only counts its memory)
  size_t memory_bytes_ = 0;
  size_t weight_cache_bytes_ = 0;  // of memory_bytes_: wq_ (codes, transposed codes, block scales), FP4 scalars
  size_t gemm_scratch_bytes_ = 0;  // the FP4 products' operand conversions at max_rows (the GEMM layer's scratch)
  size_t saved_input_bytes_ = 0;   // of memory_bytes_: x_saved_
};

}  // namespace llmc
