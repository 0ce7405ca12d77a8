// llmc/model/gpt2/gpt2.h: the GPT-2 model on the GPU (a Model, llmc/model/model.h): the named views of the parameter
// and gradient buffers, the activations planned once for (B_max, T_max) and reused, the four linears of every block
// (llmc/precision/linear: BF16 or FP8 per the recipe's plan), and the forward / backward orchestration over the
// kernels of llmc/kernels/. Its family descriptor is llmc/model/gpt2/gpt2_family.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/model/model.h"
#include "llmc/precision/linear.h"

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

class GPT2 : public Model {
 public:
  // Allocates parameters, gradients and activations for micro-batches up to (B, T).
  // recompute: 0 = keep every activation; 1 = recompute the GELU output and the LayerNorm outputs in backward.
  // memory = DeviceMemory::Count: the same plan, nothing allocated (Model's memory plan).
  GPT2(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe = PrecisionRecipe(),
       DeviceMemory memory = DeviceMemory::Allocate);

  void forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s) override;
  void backward(cudaStream_t s) override;

 private:
  // Saved-for-backward activations of one transformer block, N = B*T rows.
  struct LayerActs {
    bf16* ln1;          // (N, C)   LayerNorm 1 output (shared by all layers when recomputing or saved as FP8)
    float* ln1_mean;    // (N)
    float* ln1_rstd;    // (N)
    bf16* qkv;          // (N, 3C)  c_attn output: per token q heads | k heads | v heads
    bf16* atty;         // (N, C)   attention output (heads concatenated)
    float* att_lse;     // (B, NH, T) log-sum-exp of the scaled scores
    SavedActivation residual2;  // (N, C) residual stream after attention: residual_in + attproj (ln_2's input)
    bf16* ln2;          // (N, C)   LayerNorm 2 output (shared when recomputing or saved as FP8)
    float* ln2_mean;    // (N)
    float* ln2_rstd;    // (N)
    SavedActivation fch;  // (N, 4C) c_fc output before GELU (the GELU_AUX of the GEMM), read by the GELU backward
    bf16* fch_gelu;     // (N, 4C)  GELU output, input of mlp.c_proj (shared when recomputing or saved as FP8)
    SavedActivation residual3;  // (N, C) residual stream after the MLP: residual2 + fcproj (the block output)
  };
  // The four linears of a block, each with its precision plan.
  struct LayerLinears {
    std::unique_ptr<Linear> qkv, attproj, fc, fcproj;
  };

  // The activations in the order they are laid out (Model::plan_activations runs it twice).
  void carve_activations(Carver& cv);
  const SavedActivation& layer_input(int l) const;  // residual stream entering block l (N, C)
  // The end of a sub-block: residual_out (N, C) = residual_in + x · wᵀ + b, then norm_out (N, C) =
  // LayerNorm(residual_out) with mean, rstd (N) saved, max |norm_out| into norm_amax (may be null) and the FP8 copy of
  // residual_out into residual_copy (when wanted). A BF16 linear adds the residual inside its GEMM (one rounding, no
  // extra pass); an FP8 one writes proj_out_ and the fused residual + LayerNorm kernel adds it.
  void project_residual_norm(Linear& lin, bf16* residual_out, const Fp8GroupsOut& residual_copy, const bf16* x,
                             const bf16* w, const bf16* b, const bf16* residual_in, bf16* norm_out, float* mean,
                             float* rstd, const bf16* norm_w, const bf16* norm_b, float* norm_amax, int N, bool train,
                             cudaStream_t s);

  GPT2Tensors<bf16> w_;
  GPT2Tensors<float> g_;
  std::vector<LayerLinears> linears_;
  std::unique_ptr<Linear> lm_head_;

  SavedActivation encoded_;     // (N, C)  wte[token] + wpe[t], the residual stream entering block 0
  std::vector<LayerActs> acts_;
  bf16* lnf_ = nullptr;         // (N, C)  final LayerNorm output
  float* lnf_mean_ = nullptr;   // (N)
  float* lnf_rstd_ = nullptr;   // (N)
  bf16* proj_out_ = nullptr;    // (N, C)  attn.c_proj / mlp.c_proj output before the residual add (not saved)
  // backward buffers
  bf16* dresidual_ = nullptr;   // (N, C)  gradient of the residual stream, accumulated through the blocks
  bf16* dsmall_ = nullptr;      // (N, C)  gradient of an (N, C) intermediate: dlnf, dln2, datty, dln1
  bf16* dbig_ = nullptr;        // (N, 4C) gradient of the pre-GELU (N, 4C) or of qkv (N, 3C)
  bf16* recomputed_gelu_ = nullptr;  // (N, H) the GELU output recomputed from fch's FP8 copy (recompute_mlp_act)
  float* scratch_ = nullptr;    // shared FP32 scratch of the deterministic reductions
  size_t scratch_floats_ = 0;
};

}  // namespace llmc
