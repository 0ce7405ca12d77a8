// llmc/model/llama/llama.cu: Llama forward and backward on the GPU (BF16 activations and weights, FP32 parameter gradients; FP8
// GEMMs where the precision recipe says so, through llmc/precision/linear). Owns the linears, the activation plan of class
// Llama (llmc/model/llama/llama.h) and the order of the kernel and GEMM calls; the math of one block is in llama.h.
//
// FP8 plumbing: the kernel that produces a linear's input (RMSNorm, SwiGLU) or output gradient (RMSNorm backward,
// SwiGLU backward, RoPE backward) also writes its amax into that linear's slot when the linear asks for one (current
// per-tensor scaling), so the linear does not read the tensor again to measure it. A linear that saves its input as
// FP8 for wgrad needs no BF16 copy in backward: such inputs (and every RMSNorm / SwiGLU output under recompute 1)
// live in one buffer shared by all blocks.
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

template <typename Scalar>
Scalar* tensor_at(Scalar* base, const ParamTable& table, const std::string& name) {
  return base + table.get(name).offset;
}

// Carves the named tensors (Hugging Face Llama names) out of a flat buffer laid out by the table. The fused weights
// point at their first tensor; model_spec guarantees the rest follows without a gap.
template <typename Scalar>
LlamaTensors<Scalar> carve_tensors(Scalar* base, const ParamTable& table, const ModelSpec& spec) {
  LlamaTensors<Scalar> t;
  t.embed = tensor_at(base, table, "model.embed_tokens.weight");
  t.norm_w = tensor_at(base, table, "model.norm.weight");
  t.head = spec.tied_embeddings ? t.embed : tensor_at(base, table, "lm_head.weight");
  t.layers.resize(spec.n_layer);
  for (int l = 0; l < spec.n_layer; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto& L = t.layers[l];
    L.ln1_w = tensor_at(base, table, p + "input_layernorm.weight");
    L.qkv_w = tensor_at(base, table, p + "self_attn.q_proj.weight");
    L.o_w = tensor_at(base, table, p + "self_attn.o_proj.weight");
    L.ln2_w = tensor_at(base, table, p + "post_attention_layernorm.weight");
    L.gate_up_w = tensor_at(base, table, p + "mlp.gate_proj.weight");
    L.down_w = tensor_at(base, table, p + "mlp.down_proj.weight");
    // The fused GEMMs read past the first tensor: check the layout they rely on.
    const ParamInfo& q = table.get(p + "self_attn.q_proj.weight");
    const ParamInfo& v = table.get(p + "self_attn.v_proj.weight");
    const ParamInfo& gate = table.get(p + "mlp.gate_proj.weight");
    const ParamInfo& up = table.get(p + "mlp.up_proj.weight");
    if (v.offset + v.numel != q.offset + static_cast<size_t>(spec.qkv_channels()) * spec.n_embd ||
        up.offset + up.numel != gate.offset + 2 * static_cast<size_t>(spec.ffn_hidden) * spec.n_embd)
      throw_error("Llama: the parameter table of layer %d does not store q|k|v and gate|up contiguously", l);
  }
  return t;
}

}  // namespace

Llama::Llama(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe)
    : Model(spec, B, T, recompute, recipe), precision_(recipe) {
  if (spec.arch != "llama") throw_error("Llama: model.arch is '%s'; this class builds 'llama' only", spec.arch.c_str());
  const int HS = spec.head_size();
  if (HS != 64 && HS != 128)
    throw_error("Llama: head size %d (n_embd %d / n_head %d) is not supported by the attention kernels (64, 128)", HS,
                spec.n_embd, spec.n_head);
  if (spec.n_head % spec.n_kv_head != 0)
    throw_error("Llama: n_head %d is not a multiple of n_kv_head %d", spec.n_head, spec.n_kv_head);
  if (spec.ffn_hidden % 8 != 0) throw_error("Llama: ffn_hidden %d must be a multiple of 8", spec.ffn_hidden);
  w_ = carve_tensors(params_, table_, spec);
  g_ = carve_tensors(grads_, table_, spec);

  const int N = B * T, C = spec.n_embd, Q = spec.qkv_channels(), F = spec.ffn_hidden, L = spec.n_layer;
  linears_.resize(L);
  for (int l = 0; l < L; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    BlockLinears& b = linears_[l];
    b.qkv = std::make_unique<Linear>(precision_, p + "self_attn.qkv_proj", LinearKind::Qkv, l, Q, C,
                                     plan_linear(recipe, l, L, LinearKind::Qkv), N);
    b.o = std::make_unique<Linear>(precision_, p + "self_attn.o_proj", LinearKind::AttnOut, l, C,
                                   spec.n_head * HS, plan_linear(recipe, l, L, LinearKind::AttnOut), N);
    b.gate_up = std::make_unique<Linear>(precision_, p + "mlp.gate_up_proj", LinearKind::MlpUp, l, 2 * F, C,
                                         plan_linear(recipe, l, L, LinearKind::MlpUp), N);
    b.down = std::make_unique<Linear>(precision_, p + "mlp.down_proj", LinearKind::MlpDown, l, C, F,
                                      plan_linear(recipe, l, L, LinearKind::MlpDown), N);
  }
  lm_head_ = std::make_unique<Linear>(precision_, "lm_head", LinearKind::LmHead, -1, spec.padded_vocab_size, C,
                                      plan_linear(recipe, -1, L, LinearKind::LmHead), N);
  plan_activations();
}

Llama::~Llama() { encoder_plan_.free(); }  // the base frees the activation memory

void Llama::plan_activations() {
  const size_t N = static_cast<size_t>(B_max_) * T_max_;
  const size_t C = spec_.n_embd, F = spec_.ffn_hidden, Q = spec_.qkv_channels(), Vp = spec_.padded_vocab_size;
  const size_t L = spec_.n_layer, NH = spec_.n_head;
  const bool rc = recompute_ != 0;

  // Scratch of the deterministic reductions: the largest any backward kernel asks for at (B_max, T_max).
  scratch_floats_ = std::max(rmsnorm_backward_scratch_floats(static_cast<int>(N), static_cast<int>(C)),
                             attention_backward_scratch_floats(B_max_, T_max_, static_cast<int>(NH),
                                                               spec_.head_size()));

  // A block's RMSNorm / SwiGLU outputs get their own buffer only when backward reads them as BF16 and recompute is
  // off; otherwise all blocks share one.
  auto own = [&](const Linear& consumer) { return !rc && needs_bf16_input(consumer); };
  for (int pass = 0; pass < 2; pass++) {
    Carver cv;
    if (pass == 1) {
      CUDA_CHECK(cudaMalloc(&act_memory_, activation_bytes_));
      cv.base = static_cast<char*>(act_memory_);
    }
    inputs_ = cv.take<int>(N);
    targets_ = cv.take<int>(N);
    encoded_ = cv.take<bf16>(N * C);
    bf16* shared_ln1 = cv.take<bf16>(N * C);
    bf16* shared_ln2 = cv.take<bf16>(N * C);
    bf16* shared_h = cv.take<bf16>(N * F);
    acts_.assign(L, LayerActs{});
    for (size_t l = 0; l < L; l++) {
      LayerActs& a = acts_[l];
      const BlockLinears& b = linears_[l];
      a.ln1 = own(*b.qkv) ? cv.take<bf16>(N * C) : shared_ln1;
      a.ln1_rstd = cv.take<float>(N);
      a.qkv = cv.take<bf16>(N * Q);
      a.atty = cv.take<bf16>(N * C);
      a.att_lse = cv.take<float>(N * NH);
      a.residual2 = cv.take<bf16>(N * C);
      a.ln2 = own(*b.gate_up) ? cv.take<bf16>(N * C) : shared_ln2;
      a.ln2_rstd = cv.take<float>(N);
      a.gate_up = cv.take<bf16>(N * 2 * F);
      a.h = own(*b.down) ? cv.take<bf16>(N * F) : shared_h;
      a.residual3 = cv.take<bf16>(N * C);
    }
    lnf_ = cv.take<bf16>(N * C);
    lnf_rstd_ = cv.take<float>(N);
    proj_out_ = cv.take<bf16>(N * C);
    logits_ = cv.take<bf16>(N * Vp);
    losses_ = cv.take<float>(N);
    dresidual_ = cv.take<bf16>(N * C);
    dsmall_ = cv.take<bf16>(N * C);
    dh_ = cv.take<bf16>(N * F);
    dbig_ = cv.take<bf16>(N * std::max(Q, 2 * F));
    scratch_ = cv.take<float>(scratch_floats_);
    activation_bytes_ = round_up(cv.used, 256);
  }
  CUDA_CHECK(cudaMemset(act_memory_, 0, activation_bytes_));
}

const bf16* Llama::layer_input(int l) const { return l == 0 ? encoded_ : acts_[l - 1].residual3; }

namespace {

Linear::ForwardOptions x_from_producer(const Linear& linear) {
  Linear::ForwardOptions opt;
  opt.x_amax_ready = linear.x_amax_slot() != nullptr;  // the producing kernel wrote it (see the calls below)
  return opt;
}

Linear::BackwardOptions dy_from_producer(const Linear& linear) {
  Linear::BackwardOptions opt;
  opt.dy_amax_ready = linear.dy_amax_slot() != nullptr;
  return opt;
}

}  // namespace

void Llama::forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s) {
  begin_forward(h_inputs, h_targets, B, T, grad_scale, s);
  const bool train = grad_scale > 0.0f;
  precision_.begin_forward(s);
  const int N = B * T, C = spec_.n_embd, F = spec_.ffn_hidden, NH = spec_.n_head, NKV = spec_.n_kv_head;
  const int HS = spec_.head_size(), V = spec_.vocab_size, Vp = spec_.padded_vocab_size, L = spec_.n_layer;
  const float eps = spec_.norm_eps, theta = spec_.rope_theta;

  encoder_forward(encoded_, inputs_, w_.embed, nullptr, B, T, C, s);  // (N, C) token rows, no positions
  // Block 0's input_layernorm is a plain RMSNorm; every later one (and the final norm) is fused with the residual
  // add that ends the previous block.
  rmsnorm_forward(acts_[0].ln1, acts_[0].ln1_rstd, encoded_, w_.layers[0].ln1_w, N, C, eps, s,
                  linears_[0].qkv->x_amax_slot());
  for (int l = 0; l < L; l++) {
    const auto& W = w_.layers[l];
    const BlockLinears& lin = linears_[l];
    LayerActs& a = acts_[l];
    const bf16* residual = layer_input(l);  // (N, C)
    lin.qkv->forward(a.qkv, a.ln1, W.qkv_w, nullptr, N, train, s, x_from_producer(*lin.qkv));  // (N, Q)
    rope_forward(a.qkv, B, T, NH, NKV, HS, theta, s);                                        // q, k rotated
    attention_forward(a.atty, a.att_lse, a.qkv, B, T, NH, NKV, HS, s, lin.o->x_amax_slot());  // (N, C), (B, NH, T)
    lin.o->forward(proj_out_, a.atty, W.o_w, nullptr, N, train, s, x_from_producer(*lin.o));  // (N, C)
    fused_residual_rmsnorm_forward(a.residual2, a.ln2, a.ln2_rstd, residual, proj_out_, W.ln2_w, N, C, eps, s,
                                   lin.gate_up->x_amax_slot());                               // (N, C)
    lin.gate_up->forward(a.gate_up, a.ln2, W.gate_up_w, nullptr, N, train, s,
                         x_from_producer(*lin.gate_up));                                      // (N, 2F)
    swiglu_forward(a.h, a.gate_up, N, F, s, lin.down->x_amax_slot());                        // (N, F)
    lin.down->forward(proj_out_, a.h, W.down_w, nullptr, N, train, s, x_from_producer(*lin.down));  // (N, C)
    if (l + 1 < L) {
      LayerActs& an = acts_[l + 1];
      fused_residual_rmsnorm_forward(a.residual3, an.ln1, an.ln1_rstd, a.residual2, proj_out_, w_.layers[l + 1].ln1_w,
                                     N, C, eps, s, linears_[l + 1].qkv->x_amax_slot());
    } else {
      fused_residual_rmsnorm_forward(a.residual3, lnf_, lnf_rstd_, a.residual2, proj_out_, w_.norm_w, N, C, eps, s,
                                     lm_head_->x_amax_slot());
    }
  }
  lm_head_->forward(logits_, lnf_, w_.head, nullptr, N, train, s, x_from_producer(*lm_head_));  // (N, Vp)
  if (h_targets) fused_classifier(logits_, losses_, targets_, N, V, Vp, train ? grad_scale : 0.0f, train, s);
  if (train) encoder_plan_.build(h_inputs, B, T, s);
}

void Llama::backward(cudaStream_t s) {
  begin_backward();
  precision_.begin_backward(s);
  const int B = last_B_, T = last_T_, N = B * T;
  const int C = spec_.n_embd, F = spec_.ffn_hidden, NH = spec_.n_head, NKV = spec_.n_kv_head, HS = spec_.head_size();
  const int L = spec_.n_layer;
  const float eps = spec_.norm_eps, theta = spec_.rope_theta;
  const bool rc = recompute_ != 0;
  if (rmsnorm_backward_scratch_floats(N, C) > scratch_floats_ ||
      attention_backward_scratch_floats(B, T, NH, HS) > scratch_floats_)
    throw_error("Llama::backward: the reductions of (B=%d, T=%d) need more scratch than planned (%zu floats)", B, T,
                scratch_floats_);

  // lm_head: logits (N, Vp) = lnf (N, C) · Wheadᵀ; the logits buffer now holds dlogits. dWhead (+= into the
  // embedding's gradient when tied), dlnf (N, C).
  const bf16* dlogits = logits_;
  lm_head_->backward(dsmall_, g_.head, dlogits, needs_bf16_input(*lm_head_) ? lnf_ : nullptr, w_.head, N, s);
  // Final norm: dresidual starts as the gradient of the last block's output (its amax: the last down_proj's dy).
  CUDA_CHECK(cudaMemsetAsync(dresidual_, 0, static_cast<size_t>(N) * C * sizeof(bf16), s));
  rmsnorm_backward(dresidual_, g_.norm_w, scratch_, dsmall_, acts_[L - 1].residual3, w_.norm_w, lnf_rstd_, N, C, s,
                   linears_[L - 1].down->dy_amax_slot());

  for (int l = L - 1; l >= 0; l--) {
    const auto& W = w_.layers[l];
    const auto& G = g_.layers[l];
    const BlockLinears& lin = linears_[l];
    LayerActs& a = acts_[l];
    const bf16* residual = layer_input(l);  // (N, C)
    // dresidual (N, C) = d residual3 = d residual2 (through the skip) = d down_proj output.
    // --- MLP: residual3 = residual2 + h · Wdownᵀ, h = silu(gate) * up, gate_up = ln2 · [Wgate|Wup]ᵀ
    const bool need_h = needs_bf16_input(*lin.down);
    if (rc && need_h) swiglu_forward(a.h, a.gate_up, N, F, s);                               // recompute (N, F)
    lin.down->backward(dh_, G.down_w, dresidual_, need_h ? a.h : nullptr, W.down_w, N, s,
                       dy_from_producer(*lin.down));                                          // dh (N, F)
    swiglu_backward(dbig_, dh_, a.gate_up, N, F, s, lin.gate_up->dy_amax_slot());            // dgate_up (N, 2F)
    const bool need_ln2 = needs_bf16_input(*lin.gate_up);
    if (rc && need_ln2) rmsnorm_forward(a.ln2, nullptr, a.residual2, W.ln2_w, N, C, eps, s);  // recompute (N, C)
    lin.gate_up->backward(dsmall_, G.gate_up_w, dbig_, need_ln2 ? a.ln2 : nullptr, W.gate_up_w, N, s,
                          dy_from_producer(*lin.gate_up));                                    // dln2 (N, C)
    // ln2 = RMSNorm(residual2): dresidual += dRMSNorm/dresidual2 -> the full d residual2 (o_proj's dy)
    rmsnorm_backward(dresidual_, G.ln2_w, scratch_, dsmall_, a.residual2, W.ln2_w, a.ln2_rstd, N, C, s,
                     lin.o->dy_amax_slot());
    // --- attention: residual2 = residual + atty · Woᵀ
    lin.o->backward(dsmall_, G.o_w, dresidual_, a.atty, W.o_w, N, s, dy_from_producer(*lin.o));  // datty (N, C)
    attention_backward(dbig_, scratch_, dsmall_, a.qkv, a.atty, a.att_lse, B, T, NH, NKV, HS, s);  // dqkv rotated
    rope_backward(dbig_, B, T, NH, NKV, HS, theta, s, lin.qkv->dy_amax_slot());               // dqkv (N, Q)
    const bool need_ln1 = needs_bf16_input(*lin.qkv);
    if (rc && need_ln1) rmsnorm_forward(a.ln1, nullptr, residual, W.ln1_w, N, C, eps, s);     // recompute (N, C)
    lin.qkv->backward(dsmall_, G.qkv_w, dbig_, need_ln1 ? a.ln1 : nullptr, W.qkv_w, N, s,
                      dy_from_producer(*lin.qkv));                                            // dln1 (N, C)
    // ln1 = RMSNorm(residual): dresidual += ... -> d residual (the block input; the previous down_proj's dy)
    rmsnorm_backward(dresidual_, G.ln1_w, scratch_, dsmall_, residual, W.ln1_w, a.ln1_rstd, N, C, s,
                     l > 0 ? linears_[l - 1].down->dy_amax_slot() : nullptr);
    grads_ready(l, s);
  }
  // encoded = embed_tokens[tokens]: dembed (Vp, C) += (a second contribution when the lm_head is tied)
  encoder_backward(g_.embed, nullptr, dresidual_, encoder_plan_, B, T, C, s);
  grads_ready(-1, s);
}

}  // namespace llmc
