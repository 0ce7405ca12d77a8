// llmc/gpt2: the GPT-2 model on the GPU in BF16: parameters (one bf16 buffer carved by the ParamTable), FP32
// parameter gradients (same layout), the activations planned once for (B_max, T_max) and reused, and the forward /
// backward orchestration over the kernels of llmc/kernels.h and the GEMMs of llmc/gemm.h.
//
// Use per training micro-step:  forward(inputs, targets, B, T, grad_scale = 1/(B*T*accum), s);  backward(s);
// per optimizer step the caller zeroes the gradients (zero_grads) before the first micro-step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/kernels.h"
#include "llmc/model_spec.h"

namespace llmc {

// Pointers to every tensor of the GPT-2 parameter table inside one flat buffer (bf16 params or FP32 grads).
template <typename Scalar>
struct GPT2Tensors {
  struct Layer {
    Scalar* ln1_w;        // (C)
    Scalar* ln1_b;        // (C)
    Scalar* qkv_w;        // (3C, C)   attn.c_attn
    Scalar* qkv_b;        // (3C)
    Scalar* attproj_w;    // (C, C)    attn.c_proj
    Scalar* attproj_b;    // (C)
    Scalar* ln2_w;        // (C)
    Scalar* ln2_b;        // (C)
    Scalar* fc_w;         // (4C, C)   mlp.c_fc
    Scalar* fc_b;         // (4C)
    Scalar* fcproj_w;     // (C, 4C)   mlp.c_proj
    Scalar* fcproj_b;     // (C)
  };
  Scalar* wte = nullptr;   // (Vp, C)  token embedding, also the (tied) lm_head
  Scalar* wpe = nullptr;   // (maxT, C)
  std::vector<Layer> layers;
  Scalar* lnf_w = nullptr;  // (C)
  Scalar* lnf_b = nullptr;  // (C)
};

class GPT2 {
 public:
  // Allocates parameters, gradients and activations for micro-batches up to (B, T).
  // recompute: 0 = keep every activation; 1 = recompute the GELU output and the LayerNorm outputs in backward.
  GPT2(const ModelSpec& spec, int B, int T, int recompute);
  ~GPT2();
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const ParamTable& table() const { return table_; }
  bf16* params() { return params_; }        // (table.total_elements) bf16
  float* grads() { return grads_; }         // (table.total_elements) FP32
  size_t activation_bytes() const { return activation_bytes_; }
  int max_batch() const { return B_max_; }
  int max_seq_len() const { return T_max_; }

  // h_inputs, h_targets: host (B, T) token ids; targets may be null (logits only) and may hold -1 (ignored token).
  // With targets the per-token losses are computed; if grad_scale > 0 the logits are turned into
  // dlogits * grad_scale in the same classifier pass (train step) and backward() may follow.
  void forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s);
  // After forward with grad_scale > 0: ACCUMULATES the parameter gradients into grads() (the caller zeroes them).
  void backward(cudaStream_t s);
  // Mean per-token loss over the non-ignored targets of the last forward (synchronises the stream).
  float mean_loss(cudaStream_t s);
  // Per-token losses (B, T) FP32 of the last forward with targets (device memory).
  const float* losses() const { return losses_; }
  // (B, T, Vp) logits of the last forward when it ran with grad_scale == 0 (columns [V, Vp) are 0).
  const bf16* logits() const;
  void zero_grads(cudaStream_t s);

 private:
  // Saved-for-backward activations of one transformer block, N = B*T rows.
  struct LayerActs {
    bf16* ln1;          // (N, C)   LayerNorm 1 output (shared by all layers when recomputing)
    float* ln1_mean;    // (N)
    float* ln1_rstd;    // (N)
    bf16* qkv;          // (N, 3C)  c_attn output: per token q heads | k heads | v heads
    bf16* atty;         // (N, C)   attention output (heads concatenated)
    float* att_lse;     // (B, NH, T) log-sum-exp of the scaled scores
    bf16* residual2;    // (N, C)   residual stream after attention: residual_in + attproj
    bf16* ln2;          // (N, C)   LayerNorm 2 output (shared when recomputing)
    float* ln2_mean;    // (N)
    float* ln2_rstd;    // (N)
    bf16* fch;          // (N, 4C)  c_fc output before GELU (the GELU_AUX of the GEMM)
    bf16* fch_gelu;     // (N, 4C)  GELU output, input of mlp.c_proj (shared when recomputing)
    bf16* residual3;    // (N, C)   residual stream after the MLP: residual2 + fcproj (the block output)
  };

  void plan_activations();
  const bf16* layer_input(int l) const;  // residual stream entering block l (N, C)

  ModelSpec spec_;
  ParamTable table_;
  int B_max_, T_max_, recompute_;

  bf16* params_ = nullptr;   // (total_elements)
  float* grads_ = nullptr;   // (total_elements)
  GPT2Tensors<bf16> w_;
  GPT2Tensors<float> g_;

  void* act_memory_ = nullptr;  // one allocation carved into the buffers below
  size_t activation_bytes_ = 0;
  int* inputs_ = nullptr;       // (B, T) token ids on the device
  int* targets_ = nullptr;      // (B, T)
  bf16* encoded_ = nullptr;     // (N, C)  wte[token] + wpe[t], the residual stream entering block 0
  std::vector<LayerActs> acts_;
  bf16* lnf_ = nullptr;         // (N, C)  final LayerNorm output
  float* lnf_mean_ = nullptr;   // (N)
  float* lnf_rstd_ = nullptr;   // (N)
  bf16* proj_out_ = nullptr;    // (N, C)  attn.c_proj / mlp.c_proj output before the residual add (not saved)
  bf16* logits_ = nullptr;      // (N, Vp) logits, or dlogits after a training forward
  float* losses_ = nullptr;     // (N)    per-token loss
  // backward buffers
  bf16* dresidual_ = nullptr;   // (N, C)  gradient of the residual stream, accumulated through the blocks
  bf16* dsmall_ = nullptr;      // (N, C)  gradient of an (N, C) intermediate: dlnf, dln2, datty, dln1
  bf16* dbig_ = nullptr;        // (N, 4C) gradient of the pre-GELU (N, 4C) or of qkv (N, 3C)
  float* scratch_ = nullptr;    // shared FP32 scratch of the deterministic reductions
  size_t scratch_floats_ = 0;
  EncoderBackwardPlan encoder_plan_;

  // state of the last forward
  int last_B_ = 0, last_T_ = 0;
  bool last_has_targets_ = false;
  bool last_wrote_dlogits_ = false;
  std::vector<int> last_targets_;  // host copy, for the mean over non-ignored tokens
};

}  // namespace llmc
