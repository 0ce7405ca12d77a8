// llmc/model/gpt2/gpt2.cu: GPT-2 forward and backward on the GPU (BF16 activations and weights, FP32 parameter gradients).
// Owns the parameter / gradient / activation buffers of class GPT2 (llmc/model/gpt2/gpt2.h) and the order of the kernel and
// GEMM calls. Math of one block (pre-LN), N = B*T rows, C channels, H = ffn_hidden (4C):
//   ln1 = LN(x);  qkv = ln1·Wqkvᵀ + bqkv;  atty = attention(qkv);  residual2 = x + atty·Wprojᵀ + bproj
//   ln2 = LN(residual2);  fch = ln2·Wfcᵀ + bfc;  h = gelu(fch);  residual3 = residual2 + h·Wfcprojᵀ + bfcproj
// then lnf = LN(residual3 of the last block), logits = lnf·wteᵀ (tied lm_head), loss = cross-entropy on [0, V).
//
// COAT's FP8 activations (the recipe's nonlinear_fp8): the tensors the LayerNorm and GELU backwards read are saved as
// FP8 1x16 group copies (SavedActivation): every residual-stream tensor a LayerNorm takes (copied by the LayerNorm
// that reads it) and the pre-GELU tensor fch (copied after the c_fc GEMM, which writes it in its epilogue; the GELU
// backward then runs after the c_proj dgrad instead of in its epilogue). Their BF16 values live in working buffers:
// the residual stream alternates between two, fch has one for all blocks. The forward computes the same bits either
// way, except under recompute_mlp_act: the GELU then computes from fch's FP8 copy (and the c_fc GEMM leaves it out of
// its epilogue), and backward recomputes its output (the c_proj input) from that copy into a buffer of its own
// instead of keeping a copy of it.
//
// Without recompute, the forward's working buffers (the shared LayerNorm / GELU outputs, the FP8 path's BF16 values,
// the projections' outputs) share memory with the backward's gradient buffers: neither phase reads the other's.
#include "llmc/model/gpt2/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llmc/core/common.h"
#include "llmc/kernels/attention.h"
#include "llmc/kernels/classifier.h"
#include "llmc/kernels/gelu.h"
#include "llmc/kernels/layernorm.h"
#include "llmc/kernels/reduce.h"
#include "llmc/precision/gemm.h"
#include "llmc/precision/group_quant.h"

namespace llmc {

namespace {

// The named tensors (Hugging Face GPT-2 names) of a flat buffer laid out by the table.
template <typename Scalar>
GPT2Tensors<Scalar> carve_tensors(const ParamViews<Scalar>& at, int n_layer) {
  using Layer = typename GPT2Tensors<Scalar>::Layer;
  GPT2Tensors<Scalar> t;
  t.wte = at("transformer.wte.weight");
  t.wpe = at("transformer.wpe.weight");
  t.lnf_w = at("transformer.ln_f.weight");
  t.lnf_b = at("transformer.ln_f.bias");
  t.layers = carve_blocks<Layer>(at, n_layer, "transformer.h.",
                                 {{&Layer::ln1_w, "ln_1.weight"}, {&Layer::ln1_b, "ln_1.bias"},
                                  {&Layer::qkv_w, "attn.c_attn.weight"}, {&Layer::qkv_b, "attn.c_attn.bias"},
                                  {&Layer::attproj_w, "attn.c_proj.weight"}, {&Layer::attproj_b, "attn.c_proj.bias"},
                                  {&Layer::ln2_w, "ln_2.weight"}, {&Layer::ln2_b, "ln_2.bias"},
                                  {&Layer::fc_w, "mlp.c_fc.weight"}, {&Layer::fc_b, "mlp.c_fc.bias"},
                                  {&Layer::fcproj_w, "mlp.c_proj.weight"}, {&Layer::fcproj_b, "mlp.c_proj.bias"}});
  return t;
}

}  // namespace

GPT2::GPT2(const ModelSpec& spec, int B, int T, int recompute, const PrecisionRecipe& recipe,
           DeviceMemory memory)
    : Model(spec, B, T, recompute, recipe, memory) {
  if (spec.arch != "gpt2") throw_error("GPT2: model.arch is '%s'; this class builds 'gpt2' only", spec.arch.c_str());
  if (spec.n_kv_head != spec.n_head) throw_error("GPT2: n_kv_head (%d) must equal n_head (%d)", spec.n_kv_head, spec.n_head);
  w_ = carve_tensors(ParamViews<bf16>(params_, table_), spec.n_layer);
  g_ = carve_tensors(ParamViews<float>(grads_, table_), spec.n_layer);
  // The linears of every block and the (tied) lm_head, each with its plan from the recipe.
  const int L = spec.n_layer, C = spec.n_embd, H = spec.ffn_hidden;
  linears_.resize(L);
  for (int l = 0; l < L; l++) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    linears_[l].qkv = make_linear(p + "attn.c_attn", LinearKind::Qkv, l, 3 * C, C);
    linears_[l].attproj = make_linear(p + "attn.c_proj", LinearKind::AttnOut, l, C, C);
    linears_[l].fc = make_linear(p + "mlp.c_fc", LinearKind::MlpUp, l, H, C);
    linears_[l].fcproj = make_linear(p + "mlp.c_proj", LinearKind::MlpDown, l, C, H);
  }
  lm_head_ = make_linear("lm_head", LinearKind::LmHead, -1, spec.padded_vocab_size, C);

  // Scratch of the deterministic reductions: the largest any backward kernel asks for at (B_max, T_max).
  const int N = B * T;
  scratch_floats_ = layernorm_backward_scratch_floats(N, C);
  scratch_floats_ = std::max(scratch_floats_, attention_backward_scratch_floats(B, T, spec.n_head, spec.head_size(),
                                                                                 true));
  scratch_floats_ = std::max(scratch_floats_, bias_backward_scratch_floats(N, H));
  plan_activations([this](Carver& cv) { carve_activations(cv); });
}

void GPT2::carve_activations(Carver& cv) {
  const size_t N = (size_t)B_max_ * T_max_;
  const size_t C = spec_.n_embd, H = spec_.ffn_hidden, Vp = spec_.padded_vocab_size, L = spec_.n_layer;
  const size_t NH = spec_.n_head;
  acts_.assign(L, LayerActs{});
  // Working memory of one phase. The gradients flowing through the blocks are the backward's only; the forward's
  // working buffers are carved over them when nothing of the forward's is read after it
  // (forward_and_backward_overlay).
  cv.use = ActivationUse::Working;
  const size_t phase_start = cv.mark();
  dresidual_ = cv.take<bf16>(N * C);
  dsmall_ = cv.take<bf16>(N * C);
  dbig_ = cv.take<bf16>(N * std::max(3 * C, H));
  recomputed_gelu_ = recipe_.recompute_mlp_act ? cv.take<bf16>(N * H) : nullptr;
  if (forward_and_backward_overlay()) cv.rewind(phase_start);
  // A layer keeps its own LayerNorm / GELU outputs only when backward reads them in BF16; the others share one buffer
  // per tensor, carved only when some layer uses it (Model::input_buffer, shared_input_buffer).
  using Lin = LayerLinears;
  bf16* shared_ln1 = shared_input_buffer(cv, linears_, [](const Lin& l) -> const Linear& { return *l.qkv; }, N * C);
  bf16* shared_ln2 = shared_input_buffer(cv, linears_, [](const Lin& l) -> const Linear& { return *l.fc; }, N * C);
  bf16* shared_gelu = shared_input_buffer(cv, linears_, [](const Lin& l) -> const Linear& { return *l.fcproj; }, N * H);
  // Under nonlinear_fp8 (SavedActivation): the BF16 residual stream in two buffers (the block input and residual3
  // in one, residual2 in the other: a block's output overwrites its input, which residual2 no longer needs), fch in
  // one. Backward reads the FP8 copies.
  const bool fp8_copies = recipe_.nonlinear_fp8;
  bf16* stream_block = fp8_copies ? cv.take<bf16>(N * C) : nullptr;
  bf16* stream_mid = fp8_copies ? cv.take<bf16>(N * C) : nullptr;
  bf16* shared_fch = fp8_copies ? cv.take<bf16>(N * H) : nullptr;
  // proj_out_: only for projections whose plan cannot add the residual in its GEMM (FP8)
  bool any_unfused = false;
  for (const LayerLinears& lin : linears_) any_unfused |= !lin.attproj->adds_residual() || !lin.fcproj->adds_residual();
  proj_out_ = any_unfused ? cv.take<bf16>(N * C) : nullptr;
  cv.end_overlay();
  cv.use = ActivationUse::Saved;
  encoded_ = saved_activation(cv, N, C, stream_block);
  for (size_t l = 0; l < L; l++) {
    LayerActs& a = acts_[l];
    const LayerLinears& lin = linears_[l];
    a.ln1 = input_buffer(cv, *lin.qkv, shared_ln1, N * C);
    a.ln1_mean = cv.take<float>(N);
    a.ln1_rstd = cv.take<float>(N);
    a.qkv = cv.take<bf16>(N * 3 * C);
    a.atty = cv.take<bf16>(N * C);
    a.att_lse = cv.take<float>(N * NH);
    a.residual2 = saved_activation(cv, N, C, stream_mid);
    a.ln2 = input_buffer(cv, *lin.fc, shared_ln2, N * C);
    a.ln2_mean = cv.take<float>(N);
    a.ln2_rstd = cv.take<float>(N);
    a.fch = saved_activation(cv, N, H, shared_fch);
    a.fch_gelu = input_buffer(cv, *lin.fcproj, shared_gelu, N * H);
    a.residual3 = saved_activation(cv, N, C, stream_block);
  }
  lnf_ = cv.take<bf16>(N * C);
  lnf_mean_ = cv.take<float>(N);
  lnf_rstd_ = cv.take<float>(N);
  cv.use = ActivationUse::Logits;
  logits_ = cv.take<bf16>(N * Vp);
  losses_ = cv.take<float>(N);
  cv.use = ActivationUse::Working;
  scratch_ = cv.take<float>(scratch_floats_);
}

const SavedActivation& GPT2::layer_input(int l) const { return l == 0 ? encoded_ : acts_[l - 1].residual3; }

void GPT2::project_residual_norm(Linear& lin, bf16* residual_out, const Fp8GroupsOut& residual_copy, const bf16* x,
                                 const bf16* w, const bf16* b, const bf16* residual_in, bf16* norm_out, float* mean,
                                 float* rstd, const bf16* norm_w, const bf16* norm_b, float* norm_amax, int N,
                                 bool train, cudaStream_t s) {
  const int C = spec_.n_embd;
  // x came from a kernel that reported its amax (attention, the GELU epilogue)
  Linear::ForwardOptions opt = x_from_producer(lin);
  if (lin.adds_residual()) {
    opt.residual = residual_in;
    lin.forward(residual_out, x, w, b, N, train, s, opt);
    layernorm_forward(norm_out, mean, rstd, residual_out, norm_w, norm_b, N, C, s, norm_amax, residual_copy);
  } else {
    lin.forward(proj_out_, x, w, b, N, train, s, opt);
    fused_residual_layernorm_forward(residual_out, norm_out, mean, rstd, residual_in, proj_out_, norm_w, norm_b, N,
                                     C, s, norm_amax, residual_copy);
  }
}

void GPT2::forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s) {
  begin_forward(h_inputs, h_targets, B, T, grad_scale, s);
  const int N = B * T, C = spec_.n_embd, H = spec_.ffn_hidden, NH = spec_.n_head, HS = spec_.head_size();
  const int V = spec_.vocab_size, Vp = spec_.padded_vocab_size, L = spec_.n_layer;
  const bool train = grad_scale > 0.0f;

  encoder_forward(encoded_.values, inputs_, w_.wte, w_.wpe, B, T, C, s);  // (N, C)
  // Block 0's ln1 is a plain LayerNorm; every later ln1 (and ln_f) is fused with the residual add that ends the
  // previous block. Each producer of a linear's input also reports its amax when that linear scales per tensor
  // from the current amax (x_amax_slot() is null otherwise).
  layernorm_forward(acts_[0].ln1, acts_[0].ln1_mean, acts_[0].ln1_rstd, encoded_.values, w_.layers[0].ln1_w,
                    w_.layers[0].ln1_b, N, C, s, linears_[0].qkv->x_amax_slot(), encoded_.copy_out(train));
  for (int l = 0; l < L; l++) {
    const auto& W = w_.layers[l];
    LayerActs& a = acts_[l];
    LayerLinears& lin = linears_[l];
    const bf16* residual = layer_input(l).values;  // (N, C)
    lin.qkv->forward(a.qkv, a.ln1, W.qkv_w, W.qkv_b, N, train, s, x_from_producer(*lin.qkv));  // (N, 3C)
    attention_forward(a.atty, a.att_lse, a.qkv, B, T, NH, NH, HS, s, lin.attproj->x_amax_slot());  // (N, C)
    // residual2 = residual + atty · Wattprojᵀ + battproj; ln2 = LN(residual2)                   // (N, C) each
    project_residual_norm(*lin.attproj, a.residual2.values, a.residual2.copy_out(train), a.atty, W.attproj_w,
                          W.attproj_b, residual, a.ln2, a.ln2_mean, a.ln2_rstd, W.ln2_w, W.ln2_b,
                          lin.fc->x_amax_slot(), N, train, s);
    if (recipe_.recompute_mlp_act) {  // fch, then the GELU of its FP8 copy (written in the same pass)
      lin.fc->forward(a.fch.values, a.ln2, W.fc_w, W.fc_b, N, train, s, x_from_producer(*lin.fc));  // (N, H)
      gelu_forward(a.fch_gelu, a.fch.values, N, H, s, lin.fcproj->x_amax_slot(), a.fch.copy_out(train),
                   /*from_copy=*/true);                                                        // (N, H)
    } else {
      Linear::ForwardOptions fc_opt = x_from_producer(*lin.fc);  // GELU output in fch_gelu, pre-GELU kept in fch
      fc_opt.pre_gelu = a.fch.values;
      fc_opt.out_amax = lin.fcproj->x_amax_slot();
      lin.fc->forward(a.fch_gelu, a.ln2, W.fc_w, W.fc_b, N, train, s, fc_opt);                // (N, H)
      const Fp8GroupsOut fch_copy = a.fch.copy_out(train);
      if (fch_copy.wanted()) fp8_groups_quantize(fch_copy, a.fch.values, N, H, s);
    }
    // residual3 = residual2 + fch_gelu · Wfcprojᵀ + bfcproj, then the next block's ln1 (or ln_f)   // (N, C) each
    if (l + 1 < L) {
      const auto& Wn = w_.layers[l + 1];
      LayerActs& an = acts_[l + 1];
      project_residual_norm(*lin.fcproj, a.residual3.values, a.residual3.copy_out(train), a.fch_gelu, W.fcproj_w,
                            W.fcproj_b, a.residual2.values, an.ln1, an.ln1_mean, an.ln1_rstd, Wn.ln1_w, Wn.ln1_b,
                            linears_[l + 1].qkv->x_amax_slot(), N, train, s);
    } else {
      project_residual_norm(*lin.fcproj, a.residual3.values, a.residual3.copy_out(train), a.fch_gelu, W.fcproj_w,
                            W.fcproj_b, a.residual2.values, lnf_, lnf_mean_, lnf_rstd_, w_.lnf_w, w_.lnf_b,
                            lm_head_->x_amax_slot(), N, train, s);
    }
  }
  lm_head_->forward(logits_, lnf_, w_.wte, nullptr, N, train, s, x_from_producer(*lm_head_));  // (N, Vp) tied
  if (h_targets) {
    fused_classifier(logits_, losses_, targets_, N, V, Vp, train ? grad_scale : 0.0f, train, s);
  }
  if (train) encoder_plan_.build(h_inputs, B, T, s);
}

void GPT2::backward(cudaStream_t s) {
  begin_backward(s);
  const int B = last_B_, T = last_T_, N = B * T;
  const int C = spec_.n_embd, H = spec_.ffn_hidden, NH = spec_.n_head, HS = spec_.head_size();
  const int L = spec_.n_layer;
  auto need_scratch = [&](size_t floats, const char* what) {
    if (floats > scratch_floats_) {
      throw_error("GPT2::backward: %s needs %zu scratch floats, planned %zu", what, floats, scratch_floats_);
    }
  };
  need_scratch(layernorm_backward_scratch_floats(N, C), "layernorm_backward");
  need_scratch(attention_backward_scratch_floats(B, T, NH, HS, true), "attention_backward");
  need_scratch(bias_backward_scratch_floats(N, H), "bias_backward");

  // lm_head (tied with wte): logits (N, Vp) = lnf (N, C) · wte (Vp, C)ᵀ; the logits buffer now holds dlogits.
  const bf16* dlogits = logits_;
  lm_head_->backward(dsmall_, g_.wte, dlogits, bf16_input(*lm_head_, lnf_), w_.wte, N, s);  // dlnf, dwte +=
  // ln_f: dresidual starts as the gradient of the last block's output. Bias gradients of the two projections that
  // add into the residual stream are the column sums of dresidual, taken by the LayerNorm backward that finishes it
  // (here: the last block's c_proj.bias); the qkv bias gradient is summed by the attention backward.
  CUDA_CHECK(cudaMemsetAsync(dresidual_, 0, (size_t)N * C * sizeof(bf16), s));
  acts_[L - 1].residual3.read([&](const auto& x) {
    layernorm_backward(dresidual_, g_.lnf_w, g_.lnf_b, scratch_, dsmall_, x, w_.lnf_w, lnf_mean_, lnf_rstd_, N, C, s,
                       linears_[L - 1].fcproj->dy_amax_slot(), g_.layers[L - 1].fcproj_b);
  });

  for (int l = L - 1; l >= 0; l--) {
    const auto& W = w_.layers[l];
    const auto& G = g_.layers[l];
    LayerActs& a = acts_[l];
    LayerLinears& lin = linears_[l];
    const SavedActivation& residual = layer_input(l);  // (N, C)
    // dresidual (N, C) = d residual3 = d residual2 (through the skip) = d fcproj output.
    // --- MLP: residual3 = residual2 + fch_gelu · Wfcprojᵀ + bfcproj
    bf16* fch_gelu = a.fch_gelu;
    if (recomputes_mlp_act(*lin.fcproj)) {  // from fch's FP8 copy: the forward's bits
      fch_gelu = recomputed_gelu_;
      gelu_forward(fch_gelu, a.fch.copy_view(), N, H, s);                                     // (N, H)
    } else if (recomputes_input(*lin.fcproj)) {
      gelu_forward(fch_gelu, a.fch.values, (size_t)N * H, s);                                 // recompute
    }
    Linear::BackwardOptions fcproj_opt = dy_from_producer(*lin.fcproj);  // dfch (N, H) = dh * gelu'(fch)
    const bool gelu_in_epilogue = !a.fch.copy.wanted();  // else from the FP8 copy after the dgrad
    if (gelu_in_epilogue) {
      fcproj_opt.x_pre_gelu = a.fch.values;
      fcproj_opt.dx_amax = lin.fc->dy_amax_slot();
    }
    lin.fcproj->backward(dbig_, G.fcproj_w, dresidual_, bf16_input(*lin.fcproj, fch_gelu), W.fcproj_w, N, s,
                         fcproj_opt);
    if (!gelu_in_epilogue)
      gelu_backward_inplace(dbig_, a.fch.copy_view(), N, H, s, lin.fc->dy_amax_slot());
    // fch = ln2 · Wfcᵀ + bfc
    if (recomputes_input(*lin.fc))
      layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2.values, W.ln2_w, W.ln2_b, N, C, s);
    lin.fc->backward(dsmall_, G.fc_w, dbig_, bf16_input(*lin.fc, a.ln2), W.fc_w, N, s,
                     dy_from_producer(*lin.fc));                                // dln2 (N, C), dWfc (H, C) +=
    bias_backward(G.fc_b, scratch_, dbig_, N, H, s);                            // dbfc (H) +=
    // ln2 = LN(residual2): dresidual += dLN/dresidual2 -> dresidual = full d residual2
    a.residual2.read([&](const auto& x) {  // dbattproj (C) +=
      layernorm_backward(dresidual_, G.ln2_w, G.ln2_b, scratch_, dsmall_, x, W.ln2_w, a.ln2_mean, a.ln2_rstd, N, C, s,
                         lin.attproj->dy_amax_slot(), G.attproj_b);
    });
    // --- attention: residual2 = residual + atty · Wattprojᵀ + battproj
    lin.attproj->backward(dsmall_, G.attproj_w, dresidual_, bf16_input(*lin.attproj, a.atty), W.attproj_w, N, s,
                          dy_from_producer(*lin.attproj));                      // datty (N, C)
    attention_backward(dbig_, scratch_, dsmall_, a.qkv, a.atty, a.att_lse, B, T, NH, NH, HS, s,
                       lin.qkv->dy_amax_slot(), G.qkv_b);                       // dqkv (N, 3C), dbqkv (3C) +=
    // qkv = ln1 · Wqkvᵀ + bqkv
    if (recomputes_input(*lin.qkv))
      layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual.values, W.ln1_w, W.ln1_b, N, C, s);
    lin.qkv->backward(dsmall_, G.qkv_w, dbig_, bf16_input(*lin.qkv, a.ln1), W.qkv_w, N, s,
                      dy_from_producer(*lin.qkv));                              // dln1 (N, C), dWqkv (3C, C) +=
    // ln1 = LN(residual): dresidual += dLN/dresidual -> dresidual = d residual (the block input)
    // (and the previous block's dbfcproj (C) +=: dresidual is now that block's output gradient)
    residual.read([&](const auto& x) {
      layernorm_backward(dresidual_, G.ln1_w, G.ln1_b, scratch_, dsmall_, x, W.ln1_w, a.ln1_mean, a.ln1_rstd, N, C, s,
                         l > 0 ? linears_[l - 1].fcproj->dy_amax_slot() : nullptr,
                         l > 0 ? g_.layers[l - 1].fcproj_b : nullptr);
    });
    grads_ready(l, s);
  }
  // encoded = wte[tokens] + wpe[t]: dwte (Vp, C) += (second contribution to the tied matrix), dwpe (maxT, C) +=
  encoder_backward(g_.wte, g_.wpe, dresidual_, encoder_plan_, B, T, C, s);
  grads_ready(-1, s);
}

}  // namespace llmc
