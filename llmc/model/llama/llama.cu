// llmc/model/llama/llama.cu: Llama forward and backward on the GPU (BF16 activations and weights, FP32 parameter gradients; FP8
// GEMMs where the precision recipe says so, through llmc/precision/linear). Owns the linears, the activation plan of class
// Llama (llmc/model/llama/llama.h) and the order of the kernel and GEMM calls; the math of one block is in llama.h.
//
// FP8 plumbing: the kernel that produces a linear's input (RMSNorm, SwiGLU) or output gradient (RMSNorm backward,
// SwiGLU backward, RoPE backward) also writes its amax into that linear's slot when the linear asks for one (current
// per-tensor scaling), so the linear does not read the tensor again to measure it. A linear that saves its input as
// FP8 for wgrad needs no BF16 copy in backward: such inputs (and every RMSNorm / SwiGLU output under recompute 1)
// live in one buffer shared by all blocks, which is not carved when no block needs it.
//
// COAT's FP8 activations (the recipe's nonlinear_fp8): the tensors the RMSNorm and SwiGLU backwards read (every
// residual-stream tensor a norm takes, and gate_up) are saved as FP8 1x16 group copies written by their producers
// (SavedActivation); their BF16 values then live in working buffers: the residual stream alternates between two, and
// gate_up has one for all blocks.
//
// Under recompute_mlp_act the SwiGLU computes from gate_up's FP8 copy, and backward recomputes its output (the
// down_proj input) from that copy into a buffer of its own instead of keeping a copy of it.
//
// Without recompute, the forward's working buffers (the shared inputs above, the FP8 path's BF16 values, the
// projections' outputs) share memory with the backward's gradient buffers: neither phase reads the other's.
#include "llmc/model/llama/llama.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "llmc/core/common.h"
#include "llmc/kernels/attention.h"
#include "llmc/kernels/classifier.h"
#include "llmc/kernels/rmsnorm.h"
#include "llmc/kernels/rope.h"
#include "llmc/kernels/swiglu.h"
#include "llmc/precision/gemm.h"

namespace llmc {

namespace {

// The named tensors (Hugging Face Llama names) of a flat buffer laid out by the table. The fused weights point at
// their first tensor, once the table is checked to store the rest after it without a gap.
template <typename Scalar>
LlamaTensors<Scalar> carve_tensors(const ParamViews<Scalar>& at, const ModelSpec& spec) {
  using Layer = typename LlamaTensors<Scalar>::Layer;
  LlamaTensors<Scalar> t;
  t.embed = at("model.embed_tokens.weight");
  t.norm_w = at("model.norm.weight");
  t.head = spec.tied_embeddings ? t.embed : at("lm_head.weight");
  t.layers = carve_blocks<Layer>(
      at, spec.n_layer, "model.layers.",
      {{&Layer::ln1_w, "input_layernorm.weight"},
       {&Layer::qkv_w, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
       {&Layer::o_w, "self_attn.o_proj.weight"},
       {&Layer::ln2_w, "post_attention_layernorm.weight"},
       {&Layer::gate_up_w, {"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
       {&Layer::down_w, "mlp.down_proj.weight"}});
  return t;
}

}  // namespace

Llama::Llama(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe,
             DeviceMemory memory)
    : Model(spec, B, T, recompute, recipe, memory) {
  if (spec.arch != "llama") throw_error("Llama: model.arch is '%s'; this class builds 'llama' only", spec.arch.c_str());
  const int HS = spec.head_size();
  if (HS != 64 && HS != 128)
    throw_error("Llama: head size %d (n_embd %d / n_head %d) is not supported by the attention kernels (64, 128)", HS,
                spec.n_embd, spec.n_head);
  if (spec.n_head % spec.n_kv_head != 0)
    throw_error("Llama: n_head %d is not a multiple of n_kv_head %d", spec.n_head, spec.n_kv_head);
  if (spec.ffn_hidden % 8 != 0) throw_error("Llama: ffn_hidden %d must be a multiple of 8", spec.ffn_hidden);
  w_ = carve_tensors(ParamViews<bf16>(params_, table_), spec);
  g_ = carve_tensors(ParamViews<float>(grads_, table_), spec);

  const int C = spec.n_embd, Q = spec.qkv_channels(), F = spec.ffn_hidden, L = spec.n_layer;
  linears_.resize(L);
  for (int l = 0; l < L; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    BlockLinears& b = linears_[l];
    b.qkv = make_linear(p + "self_attn.qkv_proj", LinearKind::Qkv, l, Q, C);
    b.o = make_linear(p + "self_attn.o_proj", LinearKind::AttnOut, l, C, spec.n_head * HS);
    b.gate_up = make_linear(p + "mlp.gate_up_proj", LinearKind::MlpUp, l, 2 * F, C);
    b.down = make_linear(p + "mlp.down_proj", LinearKind::MlpDown, l, C, F);
  }
  lm_head_ = make_linear("lm_head", LinearKind::LmHead, -1, spec.padded_vocab_size, C);

  // Scratch of the deterministic reductions: the largest any backward kernel asks for at (B_max, T_max).
  scratch_floats_ = std::max(rmsnorm_backward_scratch_floats(B * T, C),
                             attention_backward_scratch_floats(B, T, spec.n_head, HS));
  plan_activations([this](Carver& cv) { carve_activations(cv); });
}

void Llama::carve_activations(Carver& cv) {
  const size_t N = static_cast<size_t>(B_max_) * T_max_;
  const size_t C = spec_.n_embd, F = spec_.ffn_hidden, Q = spec_.qkv_channels(), Vp = spec_.padded_vocab_size;
  const size_t L = spec_.n_layer, NH = spec_.n_head;
  // Working memory of one phase. The gradients flowing through the blocks are the backward's only; the forward's
  // working buffers are carved over them when nothing of the forward's is read after it
  // (forward_and_backward_overlay).
  cv.use = ActivationUse::Working;
  const size_t phase_start = cv.mark();
  dresidual_ = cv.take<bf16>(N * C);
  dsmall_ = cv.take<bf16>(N * C);
  dh_ = cv.take<bf16>(N * F);
  dbig_ = cv.take<bf16>(N * std::max(Q, 2 * F));
  recomputed_h_ = recipe_.recompute_mlp_act ? cv.take<bf16>(N * F) : nullptr;
  if (forward_and_backward_overlay()) cv.rewind(phase_start);
  // A block's RMSNorm / SwiGLU outputs get their own buffer only when backward reads them in BF16; the others share
  // one buffer per tensor, carved only when some block uses it (Model::input_buffer, shared_input_buffer).
  using Block = BlockLinears;
  bf16* shared_ln1 = shared_input_buffer(cv, linears_, [](const Block& b) -> const Linear& { return *b.qkv; }, N * C);
  bf16* shared_ln2 =
      shared_input_buffer(cv, linears_, [](const Block& b) -> const Linear& { return *b.gate_up; }, N * C);
  bf16* shared_h = shared_input_buffer(cv, linears_, [](const Block& b) -> const Linear& { return *b.down; }, N * F);
  // Under nonlinear_fp8 (SavedActivation): the BF16 residual stream in two buffers (the block input and residual3
  // in one, residual2 in the other: a block's output overwrites its input, which residual2 no longer needs), gate_up
  // in one. Backward reads the FP8 copies.
  const bool fp8_copies = recipe_.nonlinear_fp8;
  bf16* stream_block = fp8_copies ? cv.take<bf16>(N * C) : nullptr;
  bf16* stream_mid = fp8_copies ? cv.take<bf16>(N * C) : nullptr;
  bf16* shared_gate_up = fp8_copies ? cv.take<bf16>(N * 2 * F) : nullptr;
  proj_out_ = cv.take<bf16>(N * C);  // o_proj's and down_proj's outputs, added to the residual stream at once
  cv.end_overlay();
  cv.use = ActivationUse::Saved;
  encoded_ = saved_activation(cv, N, C, stream_block);
  acts_.assign(L, LayerActs{});
  for (size_t l = 0; l < L; l++) {
    LayerActs& a = acts_[l];
    const BlockLinears& b = linears_[l];
    a.ln1 = input_buffer(cv, *b.qkv, shared_ln1, N * C);
    a.ln1_rstd = cv.take<float>(N);
    a.qkv = cv.take<bf16>(N * Q);
    a.atty = cv.take<bf16>(N * C);
    a.att_lse = cv.take<float>(N * NH);
    a.residual2 = saved_activation(cv, N, C, stream_mid);
    a.ln2 = input_buffer(cv, *b.gate_up, shared_ln2, N * C);
    a.ln2_rstd = cv.take<float>(N);
    a.gate_up = saved_activation(cv, N, 2 * F, shared_gate_up);
    a.h = input_buffer(cv, *b.down, shared_h, N * F);
    a.residual3 = saved_activation(cv, N, C, stream_block);
  }
  lnf_ = cv.take<bf16>(N * C);
  lnf_rstd_ = cv.take<float>(N);
  cv.use = ActivationUse::Logits;
  logits_ = cv.take<bf16>(N * Vp);
  losses_ = cv.take<float>(N);
  cv.use = ActivationUse::Working;
  scratch_ = cv.take<float>(scratch_floats_);
}

const SavedActivation& Llama::layer_input(int l) const { return l == 0 ? encoded_ : acts_[l - 1].residual3; }

void Llama::forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s) {
  begin_forward(h_inputs, h_targets, B, T, grad_scale, s);
  const bool train = grad_scale > 0.0f;
  const int N = B * T, C = spec_.n_embd, F = spec_.ffn_hidden, NH = spec_.n_head, NKV = spec_.n_kv_head;
  const int HS = spec_.head_size(), V = spec_.vocab_size, Vp = spec_.padded_vocab_size, L = spec_.n_layer;
  const float eps = spec_.norm_eps, theta = spec_.rope_theta;

  encoder_forward(encoded_.values, inputs_, w_.embed, nullptr, B, T, C, s);  // (N, C) token rows, no positions
  // Block 0's input_layernorm is a plain RMSNorm; every later one (and the final norm) is fused with the residual
  // add that ends the previous block. Each norm's input (and gate_up) gets its FP8 copy here when it has one.
  rmsnorm_forward(acts_[0].ln1, acts_[0].ln1_rstd, encoded_.values, w_.layers[0].ln1_w, N, C, eps, s,
                  linears_[0].qkv->x_amax_slot(), encoded_.copy_out(train));
  for (int l = 0; l < L; l++) {
    const auto& W = w_.layers[l];
    const BlockLinears& lin = linears_[l];
    LayerActs& a = acts_[l];
    const bf16* residual = layer_input(l).values;  // (N, C)
    lin.qkv->forward(a.qkv, a.ln1, W.qkv_w, nullptr, N, train, s, x_from_producer(*lin.qkv));  // (N, Q)
    rope_forward(a.qkv, B, T, NH, NKV, HS, theta, s);                                        // q, k rotated
    attention_forward(a.atty, a.att_lse, a.qkv, B, T, NH, NKV, HS, s, lin.o->x_amax_slot());  // (N, C), (B, NH, T)
    lin.o->forward(proj_out_, a.atty, W.o_w, nullptr, N, train, s, x_from_producer(*lin.o));  // (N, C)
    fused_residual_rmsnorm_forward(a.residual2.values, a.ln2, a.ln2_rstd, residual, proj_out_, W.ln2_w, N, C, eps, s,
                                   lin.gate_up->x_amax_slot(), a.residual2.copy_out(train));  // (N, C)
    lin.gate_up->forward(a.gate_up.values, a.ln2, W.gate_up_w, nullptr, N, train, s,
                         x_from_producer(*lin.gate_up));                                      // (N, 2F)
    swiglu_forward(a.h, a.gate_up.values, N, F, s, lin.down->x_amax_slot(), a.gate_up.copy_out(train),
                   recipe_.recompute_mlp_act);                                                // (N, F)
    lin.down->forward(proj_out_, a.h, W.down_w, nullptr, N, train, s, x_from_producer(*lin.down));  // (N, C)
    if (l + 1 < L) {
      LayerActs& an = acts_[l + 1];
      fused_residual_rmsnorm_forward(a.residual3.values, an.ln1, an.ln1_rstd, a.residual2.values, proj_out_,
                                     w_.layers[l + 1].ln1_w, N, C, eps, s, linears_[l + 1].qkv->x_amax_slot(),
                                     a.residual3.copy_out(train));
    } else {
      fused_residual_rmsnorm_forward(a.residual3.values, lnf_, lnf_rstd_, a.residual2.values, proj_out_, w_.norm_w, N,
                                     C, eps, s, lm_head_->x_amax_slot(), a.residual3.copy_out(train));
    }
  }
  lm_head_->forward(logits_, lnf_, w_.head, nullptr, N, train, s, x_from_producer(*lm_head_));  // (N, Vp)
  if (h_targets) fused_classifier(logits_, losses_, targets_, N, V, Vp, train ? grad_scale : 0.0f, train, s);
  if (train) encoder_plan_.build(h_inputs, B, T, s);
}

void Llama::backward(cudaStream_t s) {
  begin_backward(s);
  const int B = last_B_, T = last_T_, N = B * T;
  const int C = spec_.n_embd, F = spec_.ffn_hidden, NH = spec_.n_head, NKV = spec_.n_kv_head, HS = spec_.head_size();
  const int L = spec_.n_layer;
  const float eps = spec_.norm_eps, theta = spec_.rope_theta;
  if (rmsnorm_backward_scratch_floats(N, C) > scratch_floats_ ||
      attention_backward_scratch_floats(B, T, NH, HS) > scratch_floats_)
    throw_error("Llama::backward: the reductions of (B=%d, T=%d) need more scratch than planned (%zu floats)", B, T,
                scratch_floats_);

  // lm_head: logits (N, Vp) = lnf (N, C) · Wheadᵀ; the logits buffer now holds dlogits. dWhead (+= into the
  // embedding's gradient when tied), dlnf (N, C).
  const bf16* dlogits = logits_;
  lm_head_->backward(dsmall_, g_.head, dlogits, bf16_input(*lm_head_, lnf_), w_.head, N, s);
  // Final norm: dresidual starts as the gradient of the last block's output (its amax: the last down_proj's dy).
  CUDA_CHECK(cudaMemsetAsync(dresidual_, 0, static_cast<size_t>(N) * C * sizeof(bf16), s));
  acts_[L - 1].residual3.read([&](const auto& x) {
    rmsnorm_backward(dresidual_, g_.norm_w, scratch_, dsmall_, x, w_.norm_w, lnf_rstd_, N, C, s,
                     linears_[L - 1].down->dy_amax_slot());
  });

  for (int l = L - 1; l >= 0; l--) {
    const auto& W = w_.layers[l];
    const auto& G = g_.layers[l];
    const BlockLinears& lin = linears_[l];
    LayerActs& a = acts_[l];
    const SavedActivation& residual = layer_input(l);  // (N, C)
    // dresidual (N, C) = d residual3 = d residual2 (through the skip) = d down_proj output.
    // --- MLP: residual3 = residual2 + h · Wdownᵀ, h = silu(gate) * up, gate_up = ln2 · [Wgate|Wup]ᵀ
    bf16* h = a.h;
    if (recomputes_mlp_act(*lin.down)) {  // from gate_up's FP8 copy: the forward's bits
      h = recomputed_h_;
      swiglu_forward(h, a.gate_up.copy_view(), N, F, s);                                     // (N, F)
    } else if (recomputes_input(*lin.down)) {
      swiglu_forward(h, a.gate_up.values, N, F, s);                                          // recompute (N, F)
    }
    lin.down->backward(dh_, G.down_w, dresidual_, bf16_input(*lin.down, h), W.down_w, N, s,
                       dy_from_producer(*lin.down));                                          // dh (N, F)
    a.gate_up.read([&](const auto& gate_up) {                                               // dgate_up (N, 2F)
      swiglu_backward(dbig_, dh_, gate_up, N, F, s, lin.gate_up->dy_amax_slot());
    });
    if (recomputes_input(*lin.gate_up))
      rmsnorm_forward(a.ln2, nullptr, a.residual2.values, W.ln2_w, N, C, eps, s);            // recompute (N, C)
    lin.gate_up->backward(dsmall_, G.gate_up_w, dbig_, bf16_input(*lin.gate_up, a.ln2), W.gate_up_w, N, s,
                          dy_from_producer(*lin.gate_up));                                    // dln2 (N, C)
    // ln2 = RMSNorm(residual2): dresidual += dRMSNorm/dresidual2 -> the full d residual2 (o_proj's dy)
    a.residual2.read([&](const auto& x) {
      rmsnorm_backward(dresidual_, G.ln2_w, scratch_, dsmall_, x, W.ln2_w, a.ln2_rstd, N, C, s, lin.o->dy_amax_slot());
    });
    // --- attention: residual2 = residual + atty · Woᵀ
    lin.o->backward(dsmall_, G.o_w, dresidual_, bf16_input(*lin.o, a.atty), W.o_w, N, s,
                    dy_from_producer(*lin.o));                                                // datty (N, C)
    attention_backward(dbig_, scratch_, dsmall_, a.qkv, a.atty, a.att_lse, B, T, NH, NKV, HS, s);  // dqkv rotated
    rope_backward(dbig_, B, T, NH, NKV, HS, theta, s, lin.qkv->dy_amax_slot());               // dqkv (N, Q)
    if (recomputes_input(*lin.qkv)) rmsnorm_forward(a.ln1, nullptr, residual.values, W.ln1_w, N, C, eps, s);
    lin.qkv->backward(dsmall_, G.qkv_w, dbig_, bf16_input(*lin.qkv, a.ln1), W.qkv_w, N, s,
                      dy_from_producer(*lin.qkv));                                            // dln1 (N, C)
    // ln1 = RMSNorm(residual): dresidual += ... -> d residual (the block input; the previous down_proj's dy)
    residual.read([&](const auto& x) {
      rmsnorm_backward(dresidual_, G.ln1_w, scratch_, dsmall_, x, W.ln1_w, a.ln1_rstd, N, C, s,
                       l > 0 ? linears_[l - 1].down->dy_amax_slot() : nullptr);
    });
    grads_ready(l, s);
  }
  // encoded = embed_tokens[tokens]: dembed (Vp, C) += (a second contribution when the lm_head is tied)
  encoder_backward(g_.embed, nullptr, dresidual_, encoder_plan_, B, T, C, s);
  grads_ready(-1, s);
}

}  // namespace llmc
