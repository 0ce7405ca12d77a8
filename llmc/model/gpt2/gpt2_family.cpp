// llmc/model/gpt2/gpt2_family.cpp: the GPT-2 family (model.arch "gpt2", llmc/model/family.h): its presets, parameter
// table, validation, Hugging Face GPT2LMHeadModel config and Conv1D layout, llm.c's model-file
// layout, and the factory of the GPU model (llmc/model/gpt2/gpt2.h). Host code only.
//
// Parameter table (GPT2LMHeadModel names): transformer.wte.weight (Vp, C), transformer.wpe.weight (maxT, C); per block
// transformer.h.{i}.{ln_1.weight, ln_1.bias, attn.c_attn.weight (3C, C), attn.c_attn.bias, attn.c_proj.weight (C, C),
// attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight (F, C), mlp.c_fc.bias, mlp.c_proj.weight (C, F),
// mlp.c_proj.bias}; transformer.ln_f.{weight, bias}. The lm_head is tied to wte. Initialisation (Radford et al.
// 2019): matrices and embeddings normal(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj) 0.02 / sqrt(2L),
// biases 0, LayerNorm weights 1.
#include <algorithm>
#include <cmath>
#include <regex>
#include <string>

#include "llmc/core/common.h"
#include "llmc/model/family.h"
#include "llmc/model/gpt2/gpt2.h"

namespace llmc {

namespace {

constexpr float kLlmcNormEps = 1e-5f;  // llm.c's LayerNorm epsilon (fixed in its kernels)

ParamTable build_table(const ModelSpec& spec) {
  if (!spec.tied_embeddings) throw_error("gpt2 always ties its lm_head to transformer.wte (tied_embeddings false)");
  const int64_t C = spec.n_embd, F = spec.ffn_hidden, L = spec.n_layer;
  const int64_t qkv = spec.qkv_channels();  // 3C
  const float residual_std = kInitStd / std::sqrt(2.0f * static_cast<float>(L));  // scaled residual projections

  ParamTable t;
  t.vocab_size = spec.vocab_size;
  add_param(&t, "transformer.wte.weight", {spec.padded_vocab_size, C}, -1, ParamRole::TokenEmbedding, kInitStd, 0);
  add_param(&t, "transformer.wpe.weight", {spec.max_seq_len, C}, -1, ParamRole::PositionEmbedding, kInitStd, 0);
  // A LayerNorm (weight 1, bias 0) and a linear with its bias (weight normal(0, std), bias 0), in storage order.
  auto layer_norm = [&t](const std::string& name, int64_t C, int layer) {
    add_param(&t, name + ".weight", {C}, layer, ParamRole::NormWeight, 0, 1);
    add_param(&t, name + ".bias", {C}, layer, ParamRole::NormBias, 0, 0);
  };
  auto linear = [&t](const std::string& name, int64_t out, int64_t in, int layer, float std) {
    add_param(&t, name + ".weight", {out, in}, layer, ParamRole::LinearWeight, std, 0);
    add_param(&t, name + ".bias", {out}, layer, ParamRole::LinearBias, 0, 0);
  };
  for (int i = 0; i < spec.n_layer; i++) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    layer_norm(h + "ln_1", C, i);
    linear(h + "attn.c_attn", qkv, C, i, kInitStd);
    linear(h + "attn.c_proj", C, C, i, residual_std);
    layer_norm(h + "ln_2", C, i);
    linear(h + "mlp.c_fc", F, C, i, kInitStd);
    linear(h + "mlp.c_proj", C, F, i, residual_std);
  }
  layer_norm("transformer.ln_f", C, -1);
  return t;
}

void validate(const ModelSpec& m) {
  if (m.n_kv_head != m.n_head)
    throw_error("model.n_kv_head = %d but gpt2 has no grouped-query attention: it must equal model.n_head = %d",
                m.n_kv_head, m.n_head);
  if (!m.tied_embeddings)
    throw_error("model.tied_embeddings = false but gpt2 always ties its lm_head to transformer.wte (untied heads: "
                "model.arch llama)");
}

int default_ffn_hidden(int n_embd) { return 4 * n_embd; }

std::string dry_run_details(const ModelSpec&) { return ""; }

// ------------------------------------------------------------------------------------------------------------------
// Hugging Face GPT2LMHeadModel

void write_hf_config(const ModelSpec& spec, nlohmann::ordered_json* config) {
  nlohmann::ordered_json& c = *config;
  c["vocab_size"] = spec.vocab_size;
  c["n_positions"] = spec.max_seq_len;
  c["n_ctx"] = spec.max_seq_len;
  c["n_embd"] = spec.n_embd;
  c["n_layer"] = spec.n_layer;
  c["n_head"] = spec.n_head;
  c["n_inner"] = spec.ffn_hidden;
  c["activation_function"] = "gelu_new";  // the tanh approximation, as our GELU kernels
  c["layer_norm_epsilon"] = shortest_decimal(spec.norm_eps);
  c["resid_pdrop"] = 0.0;  // llm8 trains without dropout
  c["embd_pdrop"] = 0.0;
  c["attn_pdrop"] = 0.0;
  c["initializer_range"] = 0.02;
  c["scale_attn_weights"] = true;
  c["scale_attn_by_inverse_layer_idx"] = false;
  c["reorder_and_upcast_attn"] = false;
  c["tie_word_embeddings"] = true;
  if (spec.vocab_size > 50256) {  // the GPT-2 tokenizer's <|endoftext|>
    c["bos_token_id"] = 50256;
    c["eos_token_id"] = 50256;
  }
}

ModelSpec read_hf_config(const HfConfigReader& c) {
  ModelSpec s;
  s.n_layer = c.get_int("n_layer");
  s.n_head = c.get_int("n_head");
  s.n_kv_head = s.n_head;
  s.n_embd = c.get_int("n_embd");
  s.vocab_size = c.get_int("vocab_size");
  s.max_seq_len = c.get_int("n_positions");
  s.ffn_hidden = c.get_int("n_inner", default_ffn_hidden(s.n_embd));
  s.norm_eps = static_cast<float>(c.get_number("layer_norm_epsilon", 1e-5));
  s.tied_embeddings = true;
  const std::string act = c.get_string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw_error("%s: activation_function '%s' is not supported: llm8's GPT-2 uses the tanh approximation of GELU "
                "(gelu_new or gelu_pytorch_tanh)", c.path.c_str(), act.c_str());
  if (!c.get_bool("tie_word_embeddings", true))
    throw_error("%s: tie_word_embeddings is false, but llm8's GPT-2 ties lm_head to transformer.wte", c.path.c_str());
  if (!c.get_bool("scale_attn_weights", true))
    throw_error("%s: scale_attn_weights is false, but llm8's attention scales by 1/sqrt(head size)", c.path.c_str());
  if (c.get_bool("scale_attn_by_inverse_layer_idx", false))
    throw_error("%s: scale_attn_by_inverse_layer_idx is true, which llm8's GPT-2 does not implement", c.path.c_str());
  if (c.get_bool("add_cross_attention", false))
    throw_error("%s: add_cross_attention is true: llm8's GPT-2 is a decoder without cross-attention", c.path.c_str());
  if (s.n_embd % s.n_head != 0)
    throw_error("%s: n_embd %d is not divisible by n_head %d", c.path.c_str(), s.n_embd, s.n_head);
  return s;
}

// Hugging Face's Conv1D weights are stored (in, out), ours (out, in).
bool hf_transposed(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const size_t n = std::char_traits<char>::length(suffix);
    if (name.size() >= n && name.compare(name.size() - n, n, suffix) == 0) return true;
  }
  return false;
}

// The attention masks older checkpoints save.
bool hf_is_buffer(const std::string& name) {
  static const std::regex buffer(R"((transformer\.)?h\.\d+\.attn\.(bias|masked_bias))");
  return std::regex_match(name, buffer);
}

// ------------------------------------------------------------------------------------------------------------------
// llm.c's model file: llm.c's matrices are nn.Linear (out, in) like ours and its qkv rows are q | k | v like ours, so
// the per-layer tensors are only stacked.

void check_llmc(const ModelSpec& spec, const std::string& path) {
  if (spec.ffn_hidden != 4 * spec.n_embd)
    throw_error("%s: llm.c's GPT-2 has an MLP of 4 * n_embd = %d, but model.ffn_hidden is %d; use --export-hf",
                path.c_str(), 4 * spec.n_embd, spec.ffn_hidden);
  if (spec.n_kv_head != spec.n_head || !spec.tied_embeddings)
    throw_error("%s: llm.c's GPT-2 has n_kv_head == n_head and tied embeddings; use --export-hf", path.c_str());
  if (spec.norm_eps != kLlmcNormEps)
    throw_error("%s: llm.c's LayerNorm epsilon is fixed at 1e-5, but model.norm_eps is %g; use --export-hf",
                path.c_str(), static_cast<double>(spec.norm_eps));
}

ModelSpec llmc_spec(int max_seq_len, int vocab_size, int n_layer, int n_head, int n_embd, int padded_vocab_size) {
  ModelSpec s;
  s.max_seq_len = max_seq_len;
  s.vocab_size = vocab_size;
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_kv_head = n_head;
  s.n_embd = n_embd;
  s.padded_vocab_size = padded_vocab_size;
  s.ffn_hidden = 4 * n_embd;
  s.tied_embeddings = true;
  s.norm_eps = kLlmcNormEps;
  return s;
}

const LlmcFormat& llmc_format() {
  static const LlmcFormat format = {
    {{"wte", "transformer.wte.weight"},
     {"wpe", "transformer.wpe.weight"},
     {"ln1w", "transformer.h.{}.ln_1.weight"},
     {"ln1b", "transformer.h.{}.ln_1.bias"},
     {"qkvw", "transformer.h.{}.attn.c_attn.weight"},
     {"qkvb", "transformer.h.{}.attn.c_attn.bias"},
     {"attprojw", "transformer.h.{}.attn.c_proj.weight"},
     {"attprojb", "transformer.h.{}.attn.c_proj.bias"},
     {"ln2w", "transformer.h.{}.ln_2.weight"},
     {"ln2b", "transformer.h.{}.ln_2.bias"},
     {"fcw", "transformer.h.{}.mlp.c_fc.weight"},
     {"fcb", "transformer.h.{}.mlp.c_fc.bias"},
     {"fcprojw", "transformer.h.{}.mlp.c_proj.weight"},
     {"fcprojb", "transformer.h.{}.mlp.c_proj.bias"},
     {"lnfw", "transformer.ln_f.weight"},
     {"lnfb", "transformer.ln_f.bias"}},
    check_llmc,
    llmc_spec,
  };
  return format;
}

}  // namespace

const ModelFamily& gpt2_family() {
  static const ModelFamily family = {
      "gpt2",
      "GPT-2",
      {
          // name         L   NH  NKV  C     F  maxT  theta  tied
          {"gpt2-tiny",   2,  2,  0,   128,  0, 256,  0,     true},  // the test model
          {"gpt2-mini",   6,  6,  0,   384,  0, 512,  0,     true},  // the quick-start model
          {"gpt2-124m",   12, 12, 0,   768,  0, 1024, 0,     true},
          {"gpt2-350m",   24, 16, 0,   1024, 0, 1024, 0,     true},
          {"gpt2-774m",   36, 20, 0,   1280, 0, 1024, 0,     true},
          {"gpt2-1558m",  48, 25, 0,   1600, 0, 1024, 0,     true},
      },
      build_table,
      validate,
      default_ffn_hidden,
      dry_run_details,
      /*uses_rope_theta=*/false,
      {"GPT2LMHeadModel", "gpt2", write_hf_config, read_hf_config, hf_transposed, hf_is_buffer, "transformer."},
      &llmc_format(),
      make_model_of<GPT2>,
  };
  return family;
}

}  // namespace llmc
