// llmc/model/llama/llama_family.cpp: the Llama family (model.arch "llama", llmc/model/family.h): its presets, parameter
// table, validation, the default SwiGLU width, the Hugging Face LlamaForCausalLM config, and the
// factory of the GPU model (llmc/model/llama/llama.h). llm.c's model file cannot hold it. Host code only.
//
// Parameter table (LlamaForCausalLM names, no biases): model.embed_tokens.weight (Vp, C); per block model.layers.{i}.
// input_layernorm.weight (C), self_attn.q_proj.weight (NH*HS, C), self_attn.k_proj.weight (NKV*HS, C),
// self_attn.v_proj.weight (NKV*HS, C), self_attn.o_proj.weight (C, NH*HS), post_attention_layernorm.weight (C),
// mlp.gate_proj.weight (F, C), mlp.up_proj.weight (F, C), mlp.down_proj.weight (C, F); model.norm.weight (C);
// lm_head.weight (Vp, C) unless tied_embeddings. q_proj, k_proj, v_proj are stored back to back (no alignment gap:
// checked), so the q_proj pointer is the ((NH + 2*NKV)*HS, C) weight of one fused QKV GEMM; likewise gate_proj,
// up_proj form the (2F, C) weight of one fused gate|up GEMM whose output rows are [gate | up]. Initialisation as
// GPT-2: matrices normal(0, 0.02), o_proj and down_proj (the projections into the residual stream) 0.02 / sqrt(2L),
// RMSNorm weights 1.
#include <algorithm>
#include <cmath>
#include <regex>
#include <string>

#include "llmc/core/common.h"
#include "llmc/model/family.h"
#include "llmc/model/llama/llama.h"

namespace llmc {

namespace {

ParamTable build_table(const ModelSpec& spec) {
  const int64_t C = spec.n_embd, F = spec.ffn_hidden, L = spec.n_layer, HS = spec.head_size();
  const int64_t q_rows = static_cast<int64_t>(spec.n_head) * HS, kv_rows = static_cast<int64_t>(spec.n_kv_head) * HS;
  const float residual_std = kInitStd / std::sqrt(2.0f * static_cast<float>(L));

  ParamTable t;
  t.vocab_size = spec.vocab_size;
  add_param(&t, "model.embed_tokens.weight", {spec.padded_vocab_size, C}, -1, ParamRole::TokenEmbedding, kInitStd, 0);
  for (int i = 0; i < spec.n_layer; i++) {
    const std::string h = "model.layers." + std::to_string(i) + ".";
    add_param(&t, h + "input_layernorm.weight", {C}, i, ParamRole::NormWeight, 0, 1);
    add_fused_params(&t, {{h + "self_attn.q_proj.weight", q_rows}, {h + "self_attn.k_proj.weight", kv_rows},
                          {h + "self_attn.v_proj.weight", kv_rows}}, C, i, kInitStd);
    add_param(&t, h + "self_attn.o_proj.weight", {C, q_rows}, i, ParamRole::LinearWeight, residual_std, 0);
    add_param(&t, h + "post_attention_layernorm.weight", {C}, i, ParamRole::NormWeight, 0, 1);
    add_fused_params(&t, {{h + "mlp.gate_proj.weight", F}, {h + "mlp.up_proj.weight", F}}, C, i, kInitStd);
    add_param(&t, h + "mlp.down_proj.weight", {C, F}, i, ParamRole::LinearWeight, residual_std, 0);
  }
  add_param(&t, "model.norm.weight", {C}, -1, ParamRole::NormWeight, 0, 1);
  if (!spec.tied_embeddings)
    add_param(&t, "lm_head.weight", {spec.padded_vocab_size, C}, -1, ParamRole::LmHead, kInitStd, 0);
  return t;
}

void validate(const ModelSpec& m) {
  if (m.ffn_hidden % 8 != 0)
    throw_error("model.ffn_hidden = %d must be a multiple of 8 for llama (the SwiGLU kernel and the gate|up GEMM "
                "move 8 bf16 per 16-byte access)", m.ffn_hidden);
}

// 8C/3 rounded up to a multiple of 256 (the LLaMA rule with multiple_of = 256, ffn_dim_multiplier = 1; three matrices
// of 8C/3 hold as many parameters as GPT-2's two of 4C).
int default_ffn_hidden(int n_embd) {
  const int hidden = 8 * n_embd / 3;
  return static_cast<int>(round_up(static_cast<size_t>(hidden), 256));
}

std::string dry_run_details(const ModelSpec& m) {
  return strformat(", %d kv heads, RoPE theta %g, %s lm_head", m.n_kv_head, static_cast<double>(m.rope_theta),
                   m.tied_embeddings ? "tied" : "untied");
}

// ------------------------------------------------------------------------------------------------------------------
// Hugging Face LlamaForCausalLM

void write_hf_config(const ModelSpec& spec, nlohmann::ordered_json* config) {
  nlohmann::ordered_json& c = *config;
  c["vocab_size"] = spec.vocab_size;
  c["hidden_size"] = spec.n_embd;
  c["intermediate_size"] = spec.ffn_hidden;
  c["num_hidden_layers"] = spec.n_layer;
  c["num_attention_heads"] = spec.n_head;
  c["num_key_value_heads"] = spec.n_kv_head;
  c["head_dim"] = spec.head_size();
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = spec.max_seq_len;
  c["rms_norm_eps"] = shortest_decimal(spec.norm_eps);
  c["rope_theta"] = shortest_decimal(spec.rope_theta);
  c["rope_scaling"] = nullptr;  // plain RoPE (rotate_half convention, as our kernels)
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["mlp_bias"] = false;
  c["pretraining_tp"] = 1;
  c["initializer_range"] = 0.02;
  c["tie_word_embeddings"] = spec.tied_embeddings;
}

// RoPE settings: rope_theta at the top level (transformers 4.x) or in rope_parameters (5.x); only plain RoPE.
float rope_theta(const HfConfigReader& c) {
  double theta = c.get_number("rope_theta", 10000.0);
  std::string rope_type = "default";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!c.has(key)) continue;
    const nlohmann::json& r = c.j[key];
    if (!r.is_object())
      throw_error("%s: '%s' must be an object or null, got %s", c.path.c_str(), key, r.dump().c_str());
    const HfConfigReader inner{r, c.path};
    if (inner.has("rope_theta")) theta = inner.get_number("rope_theta", theta);
    const std::string type = inner.get_string("rope_type", inner.get_string("type", "default"));
    if (type != "default") rope_type = type;
  }
  if (rope_type != "default")
    throw_error("%s: RoPE scaling '%s' is not supported: llm8's Llama implements plain RoPE (rope_type default)",
                c.path.c_str(), rope_type.c_str());
  if (!(theta > 0)) throw_error("%s: rope_theta must be positive", c.path.c_str());
  return static_cast<float>(theta);
}

ModelSpec read_hf_config(const HfConfigReader& c) {
  ModelSpec s;
  s.n_layer = c.get_int("num_hidden_layers");
  s.n_head = c.get_int("num_attention_heads");
  s.n_kv_head = c.get_int("num_key_value_heads", s.n_head);
  s.n_embd = c.get_int("hidden_size");
  s.vocab_size = c.get_int("vocab_size");
  s.max_seq_len = c.get_int("max_position_embeddings", 2048);
  s.ffn_hidden = c.get_int("intermediate_size");
  s.norm_eps = static_cast<float>(c.get_number("rms_norm_eps", 1e-6));
  s.rope_theta = rope_theta(c);
  s.tied_embeddings = c.get_bool("tie_word_embeddings", false);
  const std::string act = c.get_string("hidden_act", "silu");
  if (act != "silu")
    throw_error("%s: hidden_act '%s' is not supported: llm8's Llama MLP is SwiGLU (silu)", c.path.c_str(), act.c_str());
  if (c.get_bool("attention_bias", false) || c.get_bool("mlp_bias", false))
    throw_error("%s: attention_bias / mlp_bias is true, but llm8's Llama has no biases", c.path.c_str());
  if (s.n_embd % s.n_head != 0)
    throw_error("%s: hidden_size %d is not divisible by num_attention_heads %d", c.path.c_str(), s.n_embd, s.n_head);
  if (s.n_head % s.n_kv_head != 0)
    throw_error("%s: num_attention_heads %d is not divisible by num_key_value_heads %d", c.path.c_str(), s.n_head,
                s.n_kv_head);
  if (c.get_int("head_dim", s.head_size()) != s.head_size())
    throw_error("%s: head_dim %d differs from hidden_size / num_attention_heads = %d, which llm8's Llama assumes",
                c.path.c_str(), c.get_int("head_dim"), s.head_size());
  return s;
}

// The rotary embedding's inverse frequencies some checkpoints save.
bool hf_is_buffer(const std::string& name) {
  static const std::regex buffer(R"(.*rotary_emb\.inv_freq)");
  return std::regex_match(name, buffer);
}

}  // namespace

const ModelFamily& llama_family() {
  static const ModelFamily family = {
      "llama",
      "Llama",
      {
          // Llama-3-style shapes with the GPT-2 vocabulary of our data (50,257 padded to 50,304; 128,256 works with
          // --set model.vocab_size=128256 and uint32 token shards). tiny: the test model (GQA 2:1, head size 64,
          // untied lm_head so the tests cover that path). 125m / 350m: gpt2-124m / gpt2-350m depth, width and heads
          // with GQA 3:1 / 4:1 and the 8C/3 SwiGLU width. 1b / 3b: the shapes of Llama-3.2-1B / -3B (which tie their
          // embeddings, as here). 7b: the shape of Llama-2-7B (no GQA, FFN 11008, untied lm_head, RoPE base 10000,
          // context 4096).
          // name         L   NH  NKV  C     F     maxT  theta      tied
          {"llama-tiny",  2,  2,  1,   128,  0,    256,  10000.0f,  false},
          {"llama-125m",  12, 12, 4,   768,  0,    2048, 500000.0f, true},
          {"llama-350m",  24, 16, 4,   1024, 0,    2048, 500000.0f, true},
          {"llama-1b",    16, 32, 8,   2048, 8192, 2048, 500000.0f, true},
          {"llama-3b",    28, 24, 8,   3072, 8192, 2048, 500000.0f, true},
          {"llama-7b",    32, 32, 32,  4096, 11008, 4096, 10000.0f, false},
      },
      build_table,
      validate,
      default_ffn_hidden,
      dry_run_details,
      /*uses_rope_theta=*/true,
      {"LlamaForCausalLM", "llama", write_hf_config, read_hf_config, /*transposed=*/nullptr, hf_is_buffer, ""},
      /*llmc=*/nullptr,
      make_model_of<Llama>,
  };
  return family;
}

}  // namespace llmc
