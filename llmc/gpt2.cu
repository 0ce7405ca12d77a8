// llmc/gpt2.cu: GPT-2 forward and backward on the GPU (BF16 activations and weights, FP32 parameter gradients).
// Owns the parameter / gradient / activation buffers of class GPT2 (llmc/gpt2.h) and the order of the kernel and
// GEMM calls. Math of one block (pre-LN), N = B*T rows, C channels, H = ffn_hidden (4C):
//   ln1 = LN(x);  qkv = ln1·Wqkvᵀ + bqkv;  atty = attention(qkv);  residual2 = x + atty·Wprojᵀ + bproj
//   ln2 = LN(residual2);  fch = ln2·Wfcᵀ + bfc;  h = gelu(fch);  residual3 = residual2 + h·Wfcprojᵀ + bfcproj
// then lnf = LN(residual3 of the last block), logits = lnf·wteᵀ (tied lm_head), loss = cross-entropy on [0, V).
#include "llmc/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llmc/common.h"
#include "llmc/gemm.h"

namespace llmc {

namespace {

template <typename Scalar>
Scalar* tensor_at(Scalar* base, const ParamTable& table, const std::string& name) {
  return base + table.get(name).offset;
}

// Carves the named tensors (Hugging Face GPT-2 names) out of a flat buffer laid out by the table.
template <typename Scalar>
GPT2Tensors<Scalar> carve_tensors(Scalar* base, const ParamTable& table, int n_layer) {
  GPT2Tensors<Scalar> t;
  t.wte = tensor_at(base, table, "transformer.wte.weight");
  t.wpe = tensor_at(base, table, "transformer.wpe.weight");
  t.lnf_w = tensor_at(base, table, "transformer.ln_f.weight");
  t.lnf_b = tensor_at(base, table, "transformer.ln_f.bias");
  t.layers.resize(n_layer);
  for (int l = 0; l < n_layer; l++) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    auto& L = t.layers[l];
    L.ln1_w = tensor_at(base, table, p + "ln_1.weight");
    L.ln1_b = tensor_at(base, table, p + "ln_1.bias");
    L.qkv_w = tensor_at(base, table, p + "attn.c_attn.weight");
    L.qkv_b = tensor_at(base, table, p + "attn.c_attn.bias");
    L.attproj_w = tensor_at(base, table, p + "attn.c_proj.weight");
    L.attproj_b = tensor_at(base, table, p + "attn.c_proj.bias");
    L.ln2_w = tensor_at(base, table, p + "ln_2.weight");
    L.ln2_b = tensor_at(base, table, p + "ln_2.bias");
    L.fc_w = tensor_at(base, table, p + "mlp.c_fc.weight");
    L.fc_b = tensor_at(base, table, p + "mlp.c_fc.bias");
    L.fcproj_w = tensor_at(base, table, p + "mlp.c_proj.weight");
    L.fcproj_b = tensor_at(base, table, p + "mlp.c_proj.bias");
  }
  return t;
}

// Hands out 256-byte aligned pieces of one allocation (first pass: base = null, only counts the bytes).
struct Carver {
  char* base = nullptr;
  size_t used = 0;
  template <typename Scalar>
  Scalar* take(size_t count) {
    used = round_up(used, 256);
    Scalar* p = base ? reinterpret_cast<Scalar*>(base + used) : nullptr;
    used += count * sizeof(Scalar);
    return p;
  }
};

}  // namespace

GPT2::GPT2(const ModelSpec& spec, int B, int T, int recompute)
    : spec_(spec), table_(build_param_table(spec)), B_max_(B), T_max_(T), recompute_(recompute) {
  if (spec.arch != "gpt2") throw_error("GPT2: model.arch is '%s'; this class builds 'gpt2' only", spec.arch.c_str());
  if (B <= 0 || T <= 0) throw_error("GPT2: micro-batch B=%d and sequence length T=%d must be positive", B, T);
  if (T > spec.max_seq_len) {
    throw_error("GPT2: train.seq_len=%d exceeds the context length model.max_seq_len=%d", T, spec.max_seq_len);
  }
  if (recompute != 0 && recompute != 1) throw_error("GPT2: train.recompute must be 0 or 1 (got %d)", recompute);
  if (spec.n_kv_head != spec.n_head) throw_error("GPT2: n_kv_head (%d) must equal n_head (%d)", spec.n_kv_head, spec.n_head);
  gemm_init();
  CUDA_CHECK(cudaMalloc(&params_, table_.total_elements * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&grads_, table_.total_elements * sizeof(float)));
  CUDA_CHECK(cudaMemset(params_, 0, table_.total_elements * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(grads_, 0, table_.total_elements * sizeof(float)));
  w_ = carve_tensors(params_, table_, spec.n_layer);
  g_ = carve_tensors(grads_, table_, spec.n_layer);
  plan_activations();
}

GPT2::~GPT2() {
  encoder_plan_.free();
  cudaFree(act_memory_);
  cudaFree(grads_);
  cudaFree(params_);
}

void GPT2::plan_activations() {
  const size_t N = (size_t)B_max_ * T_max_;
  const size_t C = spec_.n_embd, H = spec_.ffn_hidden, Vp = spec_.padded_vocab_size, L = spec_.n_layer;
  const size_t NH = spec_.n_head;
  const bool rc = recompute_ != 0;

  // Scratch of the deterministic reductions: the largest any backward kernel asks for at (B_max, T_max).
  scratch_floats_ = layernorm_backward_scratch_floats((int)N, (int)C);
  scratch_floats_ = std::max(scratch_floats_, attention_backward_scratch_floats(B_max_, T_max_, (int)NH,
                                                                                 spec_.head_size()));
  for (size_t oc : {C, 3 * C, H}) scratch_floats_ = std::max(scratch_floats_, bias_backward_scratch_floats((int)N, (int)oc));

  for (int pass = 0; pass < 2; pass++) {
    Carver cv;
    if (pass == 1) {
      CUDA_CHECK(cudaMalloc(&act_memory_, activation_bytes_));
      cv.base = static_cast<char*>(act_memory_);
    }
    inputs_ = cv.take<int>(N);
    targets_ = cv.take<int>(N);
    encoded_ = cv.take<bf16>(N * C);
    acts_.assign(L, LayerActs{});
    bf16* shared_ln1 = rc ? cv.take<bf16>(N * C) : nullptr;
    bf16* shared_ln2 = rc ? cv.take<bf16>(N * C) : nullptr;
    bf16* shared_gelu = rc ? cv.take<bf16>(N * H) : nullptr;
    for (size_t l = 0; l < L; l++) {
      LayerActs& a = acts_[l];
      a.ln1 = rc ? shared_ln1 : cv.take<bf16>(N * C);
      a.ln1_mean = cv.take<float>(N);
      a.ln1_rstd = cv.take<float>(N);
      a.qkv = cv.take<bf16>(N * 3 * C);
      a.atty = cv.take<bf16>(N * C);
      a.att_lse = cv.take<float>(N * NH);
      a.residual2 = cv.take<bf16>(N * C);
      a.ln2 = rc ? shared_ln2 : cv.take<bf16>(N * C);
      a.ln2_mean = cv.take<float>(N);
      a.ln2_rstd = cv.take<float>(N);
      a.fch = cv.take<bf16>(N * H);
      a.fch_gelu = rc ? shared_gelu : cv.take<bf16>(N * H);
      a.residual3 = cv.take<bf16>(N * C);
    }
    lnf_ = cv.take<bf16>(N * C);
    lnf_mean_ = cv.take<float>(N);
    lnf_rstd_ = cv.take<float>(N);
    proj_out_ = cv.take<bf16>(N * C);
    logits_ = cv.take<bf16>(N * Vp);
    losses_ = cv.take<float>(N);
    dresidual_ = cv.take<bf16>(N * C);
    dsmall_ = cv.take<bf16>(N * C);
    dbig_ = cv.take<bf16>(N * std::max(3 * C, H));
    scratch_ = cv.take<float>(scratch_floats_);
    activation_bytes_ = round_up(cv.used, 256);
  }
  CUDA_CHECK(cudaMemset(act_memory_, 0, activation_bytes_));
}

const bf16* GPT2::layer_input(int l) const { return l == 0 ? encoded_ : acts_[l - 1].residual3; }

const bf16* GPT2::logits() const {
  if (last_wrote_dlogits_) {
    throw_error("GPT2::logits: the last forward ran with grad_scale > 0, so the logits buffer now holds dlogits; "
                "run forward with grad_scale = 0 to read logits");
  }
  return logits_;
}

void GPT2::zero_grads(cudaStream_t s) {
  CUDA_CHECK(cudaMemsetAsync(grads_, 0, table_.total_elements * sizeof(float), s));
}

void GPT2::forward(const int* h_inputs, const int* h_targets, int B, int T, float grad_scale, cudaStream_t s) {
  if (B <= 0 || T <= 0 || B > B_max_ || T > T_max_) {
    throw_error("GPT2::forward: batch (B=%d, T=%d) outside the planned (B <= %d, T <= %d)", B, T, B_max_, T_max_);
  }
  if (grad_scale > 0.0f && h_targets == nullptr) {
    throw_error("GPT2::forward: a training forward (grad_scale > 0) needs targets");
  }
  const int N = B * T, C = spec_.n_embd, H = spec_.ffn_hidden, NH = spec_.n_head, HS = spec_.head_size();
  const int V = spec_.vocab_size, Vp = spec_.padded_vocab_size, L = spec_.n_layer;
  for (int i = 0; i < N; i++) {
    if (h_inputs[i] < 0 || h_inputs[i] >= V) {
      throw_error("GPT2::forward: input token %d at position %d is outside the vocabulary [0, %d)", h_inputs[i], i, V);
    }
    if (h_targets && (h_targets[i] < -1 || h_targets[i] >= V)) {
      throw_error("GPT2::forward: target %d at position %d is outside [0, %d) (or -1 = ignore)", h_targets[i], i, V);
    }
  }
  CUDA_CHECK(cudaMemcpyAsync(inputs_, h_inputs, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
  if (h_targets) {
    CUDA_CHECK(cudaMemcpyAsync(targets_, h_targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    last_targets_.assign(h_targets, h_targets + N);
  }

  encoder_forward(encoded_, inputs_, w_.wte, w_.wpe, B, T, C, s);  // (N, C)
  // Block 0's ln1 is a plain LayerNorm; every later ln1 (and ln_f) is fused with the residual add that ends the
  // previous block.
  layernorm_forward(acts_[0].ln1, acts_[0].ln1_mean, acts_[0].ln1_rstd, encoded_, w_.layers[0].ln1_w,
                    w_.layers[0].ln1_b, N, C, s);
  for (int l = 0; l < L; l++) {
    const auto& W = w_.layers[l];
    LayerActs& a = acts_[l];
    const bf16* residual = layer_input(l);  // (N, C)
    matmul_forward(a.qkv, a.ln1, W.qkv_w, W.qkv_b, N, 3 * C, C, s);              // (N, 3C)
    attention_forward(a.atty, a.att_lse, a.qkv, B, T, NH, NH, HS, s);           // (N, C), (B, NH, T)
    matmul_forward(proj_out_, a.atty, W.attproj_w, W.attproj_b, N, C, C, s);    // (N, C)
    fused_residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, residual, proj_out_, W.ln2_w,
                                     W.ln2_b, N, C, s);                          // (N, C)
    matmul_forward(a.fch_gelu, a.ln2, W.fc_w, W.fc_b, N, H, C, s, a.fch);       // (N, H) gelu out, pre-gelu aux
    matmul_forward(proj_out_, a.fch_gelu, W.fcproj_w, W.fcproj_b, N, C, H, s);  // (N, C)
    if (l + 1 < L) {
      const auto& Wn = w_.layers[l + 1];
      LayerActs& an = acts_[l + 1];
      fused_residual_layernorm_forward(a.residual3, an.ln1, an.ln1_mean, an.ln1_rstd, a.residual2, proj_out_,
                                       Wn.ln1_w, Wn.ln1_b, N, C, s);
    } else {
      fused_residual_layernorm_forward(a.residual3, lnf_, lnf_mean_, lnf_rstd_, a.residual2, proj_out_, w_.lnf_w,
                                       w_.lnf_b, N, C, s);
    }
  }
  matmul_forward(logits_, lnf_, w_.wte, nullptr, N, Vp, C, s);  // (N, Vp) tied lm_head
  const bool train = grad_scale > 0.0f;
  if (h_targets) {
    fused_classifier(logits_, losses_, targets_, N, V, Vp, train ? grad_scale : 0.0f, train, s);
  }
  if (train) encoder_plan_.build(h_inputs, B, T, s);
  last_B_ = B;
  last_T_ = T;
  last_has_targets_ = h_targets != nullptr;
  last_wrote_dlogits_ = train;
}

void GPT2::backward(cudaStream_t s) {
  if (!last_wrote_dlogits_) {
    throw_error("GPT2::backward: call forward with targets and grad_scale > 0 first (the dlogits come from it)");
  }
  const int B = last_B_, T = last_T_, N = B * T;
  const int C = spec_.n_embd, H = spec_.ffn_hidden, NH = spec_.n_head, HS = spec_.head_size();
  const int Vp = spec_.padded_vocab_size, L = spec_.n_layer;
  const bool rc = recompute_ != 0;
  auto need_scratch = [&](size_t floats, const char* what) {
    if (floats > scratch_floats_) {
      throw_error("GPT2::backward: %s needs %zu scratch floats, planned %zu", what, floats, scratch_floats_);
    }
  };
  need_scratch(layernorm_backward_scratch_floats(N, C), "layernorm_backward");
  need_scratch(attention_backward_scratch_floats(B, T, NH, HS), "attention_backward");
  need_scratch(bias_backward_scratch_floats(N, 3 * C), "bias_backward");
  need_scratch(bias_backward_scratch_floats(N, H), "bias_backward");
  need_scratch(bias_backward_scratch_floats(N, C), "bias_backward");

  // lm_head (tied with wte): logits (N, Vp) = lnf (N, C) · wte (Vp, C)ᵀ; the logits buffer now holds dlogits.
  const bf16* dlogits = logits_;
  matmul_wgrad(g_.wte, dlogits, lnf_, N, Vp, C, /*accumulate=*/true, s);                 // dwte (Vp, C) +=
  matmul_dgrad(dsmall_, dlogits, w_.wte, N, Vp, C, /*accumulate=*/false, s);             // dlnf (N, C)
  // ln_f: dresidual starts as the gradient of the last block's output.
  CUDA_CHECK(cudaMemsetAsync(dresidual_, 0, (size_t)N * C * sizeof(bf16), s));
  layernorm_backward(dresidual_, g_.lnf_w, g_.lnf_b, scratch_, dsmall_, acts_[L - 1].residual3, w_.lnf_w, lnf_mean_,
                     lnf_rstd_, N, C, s);

  for (int l = L - 1; l >= 0; l--) {
    const auto& W = w_.layers[l];
    const auto& G = g_.layers[l];
    LayerActs& a = acts_[l];
    const bf16* residual = layer_input(l);  // (N, C)
    // dresidual (N, C) = d residual3 = d residual2 (through the skip) = d fcproj output.
    // --- MLP: residual3 = residual2 + fch_gelu · Wfcprojᵀ + bfcproj
    if (rc) gelu_forward(a.fch_gelu, a.fch, (size_t)N * H, s);                 // recompute (N, H)
    matmul_wgrad(G.fcproj_w, dresidual_, a.fch_gelu, N, C, H, true, s);         // dWfcproj (C, H) +=
    bias_backward(G.fcproj_b, scratch_, dresidual_, N, C, s);                   // dbfcproj (C) +=
    matmul_dgrad(dbig_, dresidual_, W.fcproj_w, N, C, H, false, s, a.fch);      // dfch (N, H) = dh * gelu'(fch)
    // fch = ln2 · Wfcᵀ + bfc
    if (rc) layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, W.ln2_w, W.ln2_b, N, C, s);
    matmul_wgrad(G.fc_w, dbig_, a.ln2, N, H, C, true, s);                      // dWfc (H, C) +=
    bias_backward(G.fc_b, scratch_, dbig_, N, H, s);                            // dbfc (H) +=
    matmul_dgrad(dsmall_, dbig_, W.fc_w, N, H, C, false, s);                    // dln2 (N, C)
    // ln2 = LN(residual2): dresidual += dLN/dresidual2 -> dresidual = full d residual2
    layernorm_backward(dresidual_, G.ln2_w, G.ln2_b, scratch_, dsmall_, a.residual2, W.ln2_w, a.ln2_mean,
                       a.ln2_rstd, N, C, s);
    // --- attention: residual2 = residual + atty · Wattprojᵀ + battproj
    matmul_wgrad(G.attproj_w, dresidual_, a.atty, N, C, C, true, s);            // dWattproj (C, C) +=
    bias_backward(G.attproj_b, scratch_, dresidual_, N, C, s);                  // dbattproj (C) +=
    matmul_dgrad(dsmall_, dresidual_, W.attproj_w, N, C, C, false, s);          // datty (N, C)
    attention_backward(dbig_, scratch_, dsmall_, a.qkv, a.atty, a.att_lse, B, T, NH, NH, HS, s);  // dqkv (N, 3C)
    // qkv = ln1 · Wqkvᵀ + bqkv
    if (rc) layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, W.ln1_w, W.ln1_b, N, C, s);
    matmul_wgrad(G.qkv_w, dbig_, a.ln1, N, 3 * C, C, true, s);                 // dWqkv (3C, C) +=
    bias_backward(G.qkv_b, scratch_, dbig_, N, 3 * C, s);                       // dbqkv (3C) +=
    matmul_dgrad(dsmall_, dbig_, W.qkv_w, N, 3 * C, C, false, s);               // dln1 (N, C)
    // ln1 = LN(residual): dresidual += dLN/dresidual -> dresidual = d residual (the block input)
    layernorm_backward(dresidual_, G.ln1_w, G.ln1_b, scratch_, dsmall_, residual, W.ln1_w, a.ln1_mean, a.ln1_rstd,
                       N, C, s);
  }
  // encoded = wte[tokens] + wpe[t]: dwte (Vp, C) += (second contribution to the tied matrix), dwpe (maxT, C) +=
  encoder_backward(g_.wte, g_.wpe, dresidual_, encoder_plan_, B, T, C, s);
}

float GPT2::mean_loss(cudaStream_t s) {
  if (!last_has_targets_) throw_error("GPT2::mean_loss: the last forward ran without targets");
  const int N = last_B_ * last_T_;
  std::vector<float> h_losses(N);
  CUDA_CHECK(cudaMemcpyAsync(h_losses.data(), losses_, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  double sum = 0.0;
  int count = 0;
  for (int i = 0; i < N; i++) {
    if (last_targets_[i] < 0) continue;
    sum += h_losses[i];
    count++;
  }
  return count > 0 ? (float)(sum / count) : 0.0f;
}

}  // namespace llmc
