// llmc/model/llama/llama.h: the Llama model on the GPU (class Llama : Model): the pointers into the Llama parameter table,
// the linear layers (every one through llmc/precision/linear, so precision recipes apply as for GPT-2), the
// activations planned once for (B_max, T_max), and the forward / backward orchestration over the kernels of
// llmc/kernels/. Its family descriptor is llmc/model/llama/llama_family.cpp.
//
// One block, N = B*T rows, C channels, Q = (NH + 2*NKV) * HS fused q|k|v channels, F = ffn_hidden:
//   ln1 = RMSNorm(x);  qkv = ln1·[Wq|Wk|Wv]ᵀ;  RoPE(q, k) in place;  atty = attention(qkv) (GQA);
//   residual2 = x + atty·Woᵀ;  ln2 = RMSNorm(residual2);  gate_up = ln2·[Wgate|Wup]ᵀ;  h = silu(gate) * up;
//   residual3 = residual2 + h·Wdownᵀ
// then lnf = RMSNorm(residual3 of the last block), logits = lnf·Wheadᵀ (Whead = embed_tokens when tied, else
// lm_head), loss = cross-entropy on [0, V). Each residual add is fused with the RMSNorm that follows it.
#pragma once

#include <memory>
#include <vector>

#include "llmc/model/model.h"
#include "llmc/precision/linear.h"

namespace llmc {

// Pointers to every tensor of the Llama parameter table inside one flat buffer (bf16 params or FP32 grads).
// q|k|v and gate|up are stored back to back (llmc/model/llama/llama_family.cpp), so qkv_w and gate_up_w are the fused
// weights.
template <typename Scalar>
struct LlamaTensors {
  struct Layer {
    Scalar* ln1_w;      // (C)        input_layernorm
    Scalar* qkv_w;      // (Q, C)     self_attn.q_proj | k_proj | v_proj
    Scalar* o_w;        // (C, NH*HS) self_attn.o_proj
    Scalar* ln2_w;      // (C)        post_attention_layernorm
    Scalar* gate_up_w;  // (2F, C)    mlp.gate_proj | up_proj
    Scalar* down_w;     // (C, F)     mlp.down_proj
  };
  Scalar* embed = nullptr;  // (Vp, C)  model.embed_tokens
  std::vector<Layer> layers;
  Scalar* norm_w = nullptr;  // (C)     model.norm
  Scalar* head = nullptr;    // (Vp, C) lm_head, or embed when tied
};

class Llama : public Model {
 public:
  // Allocates parameters, gradients, linears and activations for micro-batches up to (B, T).
  // recompute: 0 = keep every activation; 1 = recompute the RMSNorm and SwiGLU outputs in backward.
  // memory = DeviceMemory::Count: the same plan, nothing allocated (Model's memory plan).
  Llama(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe,
        DeviceMemory memory = DeviceMemory::Allocate);

  void forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s) override;
  void backward(cudaStream_t s) override;

 private:
  struct BlockLinears {
    std::unique_ptr<Linear> qkv, o, gate_up, down;
  };
  // Saved-for-backward activations of one block, N = B*T rows.
  struct LayerActs {
    bf16* ln1;        // (N, C)   input_layernorm output (shared by all layers when not needed in backward)
    float* ln1_rstd;  // (N)
    bf16* qkv;        // (N, Q)   after RoPE: what attention consumed
    bf16* atty;       // (N, C)   attention output (heads concatenated), input of o_proj
    float* att_lse;   // (B, NH, T)
    SavedActivation residual2;  // (N, C) x + o_proj(atty), read by the post_attention_layernorm backward
    bf16* ln2;        // (N, C)   post_attention_layernorm output (shared when not needed in backward)
    float* ln2_rstd;  // (N)
    SavedActivation gate_up;    // (N, 2F) per row [gate | up], read by the SwiGLU backward
    bf16* h;          // (N, F)   SwiGLU output, input of down_proj (shared when not needed in backward)
    SavedActivation residual3;  // (N, C) residual2 + down_proj(h): the block output, read by the next norm's backward
  };

  // The activations in the order they are laid out (Model::plan_activations runs it twice).
  void carve_activations(Carver& cv);
  const SavedActivation& layer_input(int l) const;  // residual stream entering block l (N, C)

  LlamaTensors<bf16> w_;
  LlamaTensors<float> g_;
  std::vector<BlockLinears> linears_;
  std::unique_ptr<Linear> lm_head_;

  SavedActivation encoded_;    // (N, C)  embed_tokens[token], the residual stream entering block 0
  std::vector<LayerActs> acts_;
  bf16* lnf_ = nullptr;        // (N, C)  final RMSNorm output
  float* lnf_rstd_ = nullptr;  // (N)
  bf16* proj_out_ = nullptr;   // (N, C)  o_proj / down_proj output before the residual add (not saved)
  // backward buffers
  bf16* dresidual_ = nullptr;  // (N, C)  gradient of the residual stream, accumulated through the blocks
  bf16* dsmall_ = nullptr;     // (N, C)  gradient of an (N, C) intermediate: dlnf, dln2, datty, dln1
  bf16* dh_ = nullptr;         // (N, F)  gradient of the SwiGLU output
  bf16* dbig_ = nullptr;       // (N, max(Q, 2F)) gradient of gate_up or of qkv
  bf16* recomputed_h_ = nullptr;  // (N, F) the SwiGLU output recomputed from gate_up's FP8 copy (recompute_mlp_act)
  float* scratch_ = nullptr;   // shared FP32 scratch of the deterministic reductions
  size_t scratch_floats_ = 0;
};

}  // namespace llmc
