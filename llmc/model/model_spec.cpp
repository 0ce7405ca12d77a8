// llmc/model/model_spec.cpp: the GPT-2 and Llama parameter tables (Hugging Face names, nn.Linear (out, in) layout, 128-element aligned
// offsets), deterministic initialisation, parameter counts, FLOPs per token, the device-memory estimate and the model
// presets. Host code only: nothing here touches the GPU.
#include "llmc/model/model_spec.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "llmc/core/common.h"

namespace llmc {

// GPT-2 initialisation constants (Radford et al. 2019; llm.c train_gpt2.py).
static constexpr float kInitStd = 0.02f;

// Appends one tensor at the next aligned offset.
static void add_param(ParamTable* table, const std::string& name, std::vector<int64_t> shape, int layer, ParamRole role,
                      float init_std, float init_value) {
  ParamInfo p;
  p.name = name;
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t d : p.shape) p.numel *= static_cast<size_t>(d);
  p.offset = round_up(table->total_elements, ParamTable::kAlign);
  p.layer = layer;
  p.role = role;
  p.weight_decay = p.shape.size() == 2;  // matrices and embeddings; never norms or biases
  p.init_std = init_std;
  p.init_value = init_value;
  table->total_elements = p.offset + p.numel;
  table->num_parameters += p.numel;
  table->params.push_back(std::move(p));
}

// Appends the group of tensors that one fused GEMM reads as a single weight (q|k|v, gate|up) and checks that they are
// back to back: the 128-element alignment leaves no gap when each numel is a multiple of 128.
static void add_fused_group(ParamTable* table, const std::vector<std::pair<std::string, int64_t>>& rows, int64_t in,
                            int layer, float init_std) {
  const size_t first = table->params.size();
  for (const auto& [name, out] : rows) add_param(table, name, {out, in}, layer, ParamRole::LinearWeight, init_std, 0);
  for (size_t i = first + 1; i < table->params.size(); i++) {
    const ParamInfo& prev = table->params[i - 1];
    if (prev.offset + prev.numel != table->params[i].offset)
      throw_error("parameter table: '%s' (%zu elements) is not a multiple of %zu elements, so '%s' does not follow it "
                  "contiguously and the fused GEMM cannot read them as one weight (choose sizes whose products are "
                  "multiples of %zu)",
                  prev.name.c_str(), prev.numel, ParamTable::kAlign, table->params[i].name.c_str(), ParamTable::kAlign);
  }
}

static void check_spec(const ModelSpec& spec) {
  if (spec.n_layer < 1 || spec.n_head < 1 || spec.n_kv_head < 1 || spec.n_embd < 1 || spec.vocab_size < 1 ||
      spec.max_seq_len < 1 || spec.ffn_hidden < 1 || spec.padded_vocab_size < spec.vocab_size ||
      spec.n_embd % spec.n_head != 0 || spec.n_head % spec.n_kv_head != 0)
    throw_error("model spec is inconsistent (n_layer %d, n_head %d, n_kv_head %d, n_embd %d, vocab %d/%d, max_seq_len "
                "%d, ffn_hidden %d): validate the config first",
                spec.n_layer, spec.n_head, spec.n_kv_head, spec.n_embd, spec.vocab_size, spec.padded_vocab_size,
                spec.max_seq_len, spec.ffn_hidden);
}

static ParamTable build_gpt2_table(const ModelSpec& spec) {
  const int64_t C = spec.n_embd, F = spec.ffn_hidden, L = spec.n_layer;
  const int64_t qkv = spec.qkv_channels();  // 3C for gpt2
  const float residual_std = kInitStd / std::sqrt(2.0f * static_cast<float>(L));  // scaled residual projections

  ParamTable t;
  t.vocab_size = spec.vocab_size;
  add_param(&t, "transformer.wte.weight", {spec.padded_vocab_size, C}, -1, ParamRole::TokenEmbedding, kInitStd, 0);
  add_param(&t, "transformer.wpe.weight", {spec.max_seq_len, C}, -1, ParamRole::PositionEmbedding, kInitStd, 0);
  for (int i = 0; i < spec.n_layer; i++) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    add_param(&t, h + "ln_1.weight", {C}, i, ParamRole::NormWeight, 0, 1);
    add_param(&t, h + "ln_1.bias", {C}, i, ParamRole::NormBias, 0, 0);
    add_param(&t, h + "attn.c_attn.weight", {qkv, C}, i, ParamRole::LinearWeight, kInitStd, 0);
    add_param(&t, h + "attn.c_attn.bias", {qkv}, i, ParamRole::LinearBias, 0, 0);
    add_param(&t, h + "attn.c_proj.weight", {C, C}, i, ParamRole::LinearWeight, residual_std, 0);
    add_param(&t, h + "attn.c_proj.bias", {C}, i, ParamRole::LinearBias, 0, 0);
    add_param(&t, h + "ln_2.weight", {C}, i, ParamRole::NormWeight, 0, 1);
    add_param(&t, h + "ln_2.bias", {C}, i, ParamRole::NormBias, 0, 0);
    add_param(&t, h + "mlp.c_fc.weight", {F, C}, i, ParamRole::LinearWeight, kInitStd, 0);
    add_param(&t, h + "mlp.c_fc.bias", {F}, i, ParamRole::LinearBias, 0, 0);
    add_param(&t, h + "mlp.c_proj.weight", {C, F}, i, ParamRole::LinearWeight, residual_std, 0);
    add_param(&t, h + "mlp.c_proj.bias", {C}, i, ParamRole::LinearBias, 0, 0);
  }
  add_param(&t, "transformer.ln_f.weight", {C}, -1, ParamRole::NormWeight, 0, 1);
  add_param(&t, "transformer.ln_f.bias", {C}, -1, ParamRole::NormBias, 0, 0);
  return t;
}

// Llama (Hugging Face LlamaForCausalLM names), init as GPT-2: matrices normal(0, 0.02), o_proj and down_proj (the
// projections into the residual stream) 0.02 / sqrt(2L), RMSNorm weights 1; no biases.
static ParamTable build_llama_table(const ModelSpec& spec) {
  const int64_t C = spec.n_embd, F = spec.ffn_hidden, L = spec.n_layer, HS = spec.head_size();
  const int64_t q_rows = static_cast<int64_t>(spec.n_head) * HS, kv_rows = static_cast<int64_t>(spec.n_kv_head) * HS;
  const float residual_std = kInitStd / std::sqrt(2.0f * static_cast<float>(L));

  ParamTable t;
  t.vocab_size = spec.vocab_size;
  add_param(&t, "model.embed_tokens.weight", {spec.padded_vocab_size, C}, -1, ParamRole::TokenEmbedding, kInitStd, 0);
  for (int i = 0; i < spec.n_layer; i++) {
    const std::string h = "model.layers." + std::to_string(i) + ".";
    add_param(&t, h + "input_layernorm.weight", {C}, i, ParamRole::NormWeight, 0, 1);
    add_fused_group(&t, {{h + "self_attn.q_proj.weight", q_rows}, {h + "self_attn.k_proj.weight", kv_rows},
                         {h + "self_attn.v_proj.weight", kv_rows}}, C, i, kInitStd);
    add_param(&t, h + "self_attn.o_proj.weight", {C, q_rows}, i, ParamRole::LinearWeight, residual_std, 0);
    add_param(&t, h + "post_attention_layernorm.weight", {C}, i, ParamRole::NormWeight, 0, 1);
    add_fused_group(&t, {{h + "mlp.gate_proj.weight", F}, {h + "mlp.up_proj.weight", F}}, C, i, kInitStd);
    add_param(&t, h + "mlp.down_proj.weight", {C, F}, i, ParamRole::LinearWeight, residual_std, 0);
  }
  add_param(&t, "model.norm.weight", {C}, -1, ParamRole::NormWeight, 0, 1);
  if (!spec.tied_embeddings)
    add_param(&t, "lm_head.weight", {spec.padded_vocab_size, C}, -1, ParamRole::LmHead, kInitStd, 0);
  return t;
}

ParamTable build_param_table(const ModelSpec& spec) {
  if (spec.arch != "gpt2" && spec.arch != "llama")
    throw_error("model.arch '%s' is not supported (supported: gpt2, llama)", spec.arch.c_str());
  check_spec(spec);
  ParamTable t;
  if (spec.arch == "gpt2") {
    if (!spec.tied_embeddings) throw_error("gpt2 always ties its lm_head to transformer.wte (tied_embeddings false)");
    t = build_gpt2_table(spec);
  } else {
    t = build_llama_table(spec);
  }
  t.total_elements = round_up(t.total_elements, ParamTable::kAlign);
  return t;
}

// SplitMix64 finaliser: turns (seed, tensor index) into a well-mixed 64-bit generator seed.
static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Standard normal samples from std::mt19937_64 (whose output sequence the C++ standard fixes) through our own
// Box-Muller transform, so the values do not depend on the standard library's normal_distribution.
struct NormalGenerator {
  std::mt19937_64 engine;
  bool has_spare = false;
  double spare = 0.0;
  explicit NormalGenerator(uint64_t seed) : engine(seed) {}
  double uniform_open0() {  // in (0, 1]: 53 random bits
    return (static_cast<double>(engine() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  }
  double next() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    const double kTwoPi = 6.283185307179586476925286766559;
    double radius = std::sqrt(-2.0 * std::log(uniform_open0()));
    double angle = kTwoPi * uniform_open0();
    spare = radius * std::sin(angle);
    has_spare = true;
    return radius * std::cos(angle);
  }
};

void init_parameters(const ParamTable& table, uint64_t seed, float* out) {
  std::fill(out, out + table.total_elements, 0.0f);  // alignment gaps and padded vocabulary rows stay 0
  for (size_t index = 0; index < table.params.size(); index++) {
    const ParamInfo& p = table.params[index];
    float* dst = out + p.offset;
    if (p.init_std == 0.0f) {
      std::fill(dst, dst + p.numel, p.init_value);
      continue;
    }
    // Only the real vocabulary rows of the token embedding and lm_head are drawn (the padded rows stay 0), so their
    // values do not depend on the padding multiple.
    size_t drawn = p.numel;
    if ((p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead) && table.vocab_size > 0)
      drawn = std::min(p.numel, static_cast<size_t>(table.vocab_size) * static_cast<size_t>(p.shape[1]));
    NormalGenerator gen(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(index))));
    for (size_t i = 0; i < drawn; i++) dst[i] = static_cast<float>(gen.next() * p.init_std);
  }
}

size_t count_parameters(const ModelSpec& spec, bool padded_vocab) {
  ParamTable t = build_param_table(spec);
  size_t n = t.num_parameters;
  if (!padded_vocab)
    for (const ParamInfo& p : t.params)
      if (p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead)
        n -= static_cast<size_t>(spec.padded_vocab_size - spec.vocab_size) * spec.n_embd;
  return n;
}

double flops_per_token(const ModelSpec& spec, int seq_len) {
  // N = non-embedding parameters + the lm_head matmul (V x C, real vocabulary) = all real parameters except the
  // tensors that are only looked up: wpe (gpt2) and, when the lm_head has its own matrix, the token embedding.
  double n = static_cast<double>(count_parameters(spec, false));
  if (spec.arch == "gpt2") n -= static_cast<double>(spec.max_seq_len) * static_cast<double>(spec.n_embd);
  if (!spec.tied_embeddings) n -= static_cast<double>(spec.vocab_size) * static_cast<double>(spec.n_embd);
  double attention = 6.0 * spec.n_layer * static_cast<double>(spec.n_head * spec.head_size()) * seq_len;
  return 6.0 * n + attention;
}

// Memory model (bytes on one GPU, BF16 recipe), documented in configs/README.md as well:
//   weights      BF16 working copy of the whole table (alignment included): 2 B/element
//   gradients    FP32 accumulation buffer for the whole table: 4 B/element
//   master       FP32 master weights: 4 B/element, divided by world_size under ZeRO-1
//   optimizer    FP32 AdamW m and v: 8 B/element, divided by world_size under ZeRO-1
//   activations  per token of the micro-batch (B*T tokens), per layer, the tensors saved for backward in BF16:
//                ln_1 out (C), qkv (3C), attention out (C), residual after attention (C), ln_2 out (C),
//                fc out (F), GELU out (F), residual after the MLP (C); plus FP32 LayerNorm mean and rstd (2 x 2) and
//                FP32 attention log-sum-exp (n_head). recompute=1 drops ln_1 out, ln_2 out and GELU out.
//                Outside the layers: embedding output and ln_f output (C each, BF16) and ln_f stats (FP32 x 2);
//                backward scratch: two BF16 buffers of max(3C, F) per token.
//                llama (Q = (NH + 2*NKV) * HS, the fused q|k|v width): rmsnorm 1 out (C), qkv after RoPE (Q),
//                attention out (C), residual after attention (C), rmsnorm 2 out (C), gate|up (2F), SwiGLU out (F),
//                residual after the MLP (C); FP32 RMSNorm rstd (2 x 1) and log-sum-exp (n_head). recompute=1 drops
//                the two RMSNorm outputs and the SwiGLU output. Outside the layers: embedding output and final norm
//                output (C each) and its rstd; backward scratch: two BF16 buffers of max(Q, 2F) per token.
//   workspace    the logits B*T*Vp in BF16 (reused for their gradient), 32 MiB cuBLASLt workspace, and the
//                per-token FP32 losses.
MemoryEstimate estimate_memory(const ModelSpec& spec, int micro_batch, int seq_len, bool recompute, int world_size,
                               int zero_stage) {
  ParamTable t = build_param_table(spec);
  const size_t elements = t.total_elements;
  const size_t shards = (zero_stage >= 1 && world_size > 1) ? static_cast<size_t>(world_size) : 1;
  const size_t tokens = static_cast<size_t>(micro_batch) * static_cast<size_t>(seq_len);
  const size_t C = spec.n_embd, F = spec.ffn_hidden, bf16 = 2, fp32 = 4;

  MemoryEstimate m;
  m.params_bytes = elements * bf16;
  m.grads_bytes = elements * fp32;
  m.master_bytes = ceil_div(elements, shards) * fp32;
  m.optimizer_bytes = 2 * ceil_div(elements, shards) * fp32;

  size_t per_layer = 0, outside = 0, scratch = 0;
  if (spec.arch == "llama") {
    const size_t Q = static_cast<size_t>(spec.qkv_channels());
    size_t saved_bf16 = Q /*qkv*/ + C /*attention out*/ + C /*residual 2*/ + 2 * F /*gate|up*/ + C /*residual 3*/;
    if (!recompute) saved_bf16 += C /*rmsnorm 1 out*/ + C /*rmsnorm 2 out*/ + F /*SwiGLU out*/;
    per_layer = saved_bf16 * bf16 + (2 + static_cast<size_t>(spec.n_head)) * fp32;
    outside = 2 * C * bf16 + fp32;
    scratch = 2 * std::max(Q, 2 * F) * bf16;
  } else {
    size_t saved_bf16 = 3 * C /*qkv*/ + C /*attention out*/ + C /*residual 2*/ + F /*fc out*/ + C /*residual 3*/;
    if (!recompute) saved_bf16 += C /*ln_1 out*/ + C /*ln_2 out*/ + F /*GELU out*/;
    per_layer = saved_bf16 * bf16 + (2 * 2 + static_cast<size_t>(spec.n_head)) * fp32;
    outside = 2 * C * bf16 + 2 * fp32;
    scratch = 2 * std::max(3 * C, F) * bf16;
  }
  m.activations_bytes = tokens * (per_layer * spec.n_layer + outside + scratch);

  const size_t cublaslt_workspace = 32ull << 20;
  m.workspace_bytes = tokens * static_cast<size_t>(spec.padded_vocab_size) * bf16 + cublaslt_workspace + tokens * fp32;
  return m;
}

static ModelSpec gpt2_spec(int n_layer, int n_head, int n_embd, int max_seq_len) {
  ModelSpec s;
  s.arch = "gpt2";
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_kv_head = n_head;
  s.n_embd = n_embd;
  s.vocab_size = 50257;
  s.padded_vocab_size = 50304;  // 50257 rounded up to a multiple of 128
  s.max_seq_len = max_seq_len;
  s.ffn_hidden = 4 * n_embd;
  s.tied_embeddings = true;
  s.norm_eps = 1e-5f;
  return s;
}

int llama_default_ffn_hidden(int n_embd) {
  const int hidden = 8 * n_embd / 3;
  return static_cast<int>(round_up(static_cast<size_t>(hidden), 256));
}

// Llama-3-style shapes with the GPT-2 vocabulary of our data (50,257 padded to 50,304; 128,256 works with
// --set model.vocab_size=128256 and uint32 token shards). RMSNorm eps 1e-5, RoPE theta 500,000 (tiny: 10,000).
static ModelSpec llama_spec(int n_layer, int n_head, int n_kv_head, int n_embd, int ffn_hidden, int max_seq_len,
                            float rope_theta, bool tied) {
  ModelSpec s;
  s.arch = "llama";
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_kv_head = n_kv_head;
  s.n_embd = n_embd;
  s.vocab_size = 50257;
  s.padded_vocab_size = 50304;
  s.max_seq_len = max_seq_len;
  s.ffn_hidden = ffn_hidden;
  s.tied_embeddings = tied;
  s.norm_eps = 1e-5f;
  s.rope_theta = rope_theta;
  return s;
}

struct NamedPreset {
  const char* name;
  ModelSpec spec;
};

static const std::vector<NamedPreset>& presets() {
  static const std::vector<NamedPreset> table = {
      {"gpt2-tiny", gpt2_spec(2, 2, 128, 256)},     // the test model
      {"gpt2-mini", gpt2_spec(6, 6, 384, 512)},     // the quick-start model
      {"gpt2-124m", gpt2_spec(12, 12, 768, 1024)},
      {"gpt2-350m", gpt2_spec(24, 16, 1024, 1024)},
      {"gpt2-774m", gpt2_spec(36, 20, 1280, 1024)},
      {"gpt2-1558m", gpt2_spec(48, 25, 1600, 1024)},
      // Llama. tiny: the test model (GQA 2:1, head size 64, untied lm_head so the tests cover that path).
      // 125m / 350m: gpt2-124m / gpt2-350m depth, width and heads with GQA 3:1 / 4:1 and the 8C/3 SwiGLU width.
      // 1b / 3b: the shapes of Llama-3.2-1B / -3B (which tie their embeddings, as here).
      {"llama-tiny", llama_spec(2, 2, 1, 128, llama_default_ffn_hidden(128), 256, 10000.0f, false)},
      {"llama-125m", llama_spec(12, 12, 4, 768, llama_default_ffn_hidden(768), 2048, 500000.0f, true)},
      {"llama-350m", llama_spec(24, 16, 4, 1024, llama_default_ffn_hidden(1024), 2048, 500000.0f, true)},
      {"llama-1b", llama_spec(16, 32, 8, 2048, 8192, 2048, 500000.0f, true)},
      {"llama-3b", llama_spec(28, 24, 8, 3072, 8192, 2048, 500000.0f, true)},
  };
  return table;
}

bool model_preset(const std::string& name, ModelSpec* out) {
  for (const NamedPreset& p : presets()) {
    if (name == p.name) {
      if (out) *out = p.spec;
      return true;
    }
  }
  return false;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const NamedPreset& p : presets()) names.push_back(p.name);
  return names;
}

}  // namespace llmc
