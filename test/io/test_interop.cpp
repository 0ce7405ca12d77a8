// test/integration/test_interop: llmc/io/interop on the CPU. Hugging Face and llm.c round trips are byte-identical (F32 and BF16,
// vocabularies 50257 and 1000, head sizes 64 and 128); the Conv1D transposes and the dropped vocabulary padding are
// checked tensor by tensor by name in the written files; llm.c's stacked layout is checked against the table; BF16
// export rounds once to nearest even and is then stable; sharded and Hub-style (unprefixed, buffers, saved tied
// lm_head) Hugging Face directories import; every kind of bad input (unknown architecture, missing / unexpected
// tensor, wrong shape or dtype, bad magic, truncation, a config describing another model) is an error naming the
// file and the tensor or key; the weights a run starts from (checkpoint, init_from, seed); init_from a checkpoint is
// verified like a resume, NaN / Inf weights from any format are refused naming the tensor and the element (unless
// train.allow_nonfinite_init); exports never write into a checkpoint and overwrite other files only with --force; hostile files (llm.c
// headers and config.json sizes that lie about the weights, refused before anything is allocated, within time and
// memory bounds; duplicate keys, deep nesting and overflowing numbers in config.json and the index; FIFOs).
#include <gtest/gtest.h>

#include "test/support/bounded_run.h"
#include "test/support/temp_dir.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "llmc/io/checkpoint.h"
#include "llmc/core/common.h"
#include "llmc/run/config.h"
#include "llmc/io/interop.h"
#include "llmc/run/start_weights.h"
#include "llmc/io/safetensors.h"
#include "test/support/error_of.h"

namespace fs = std::filesystem;
using llmc_test::thrown_error;
using nlohmann::json;
using namespace llmc;

namespace {

ModelSpec gpt2_spec(int n_layer, int n_head, int n_embd, int vocab, int max_seq_len, int padded_multiple = 128) {
  ModelSpec s;
  s.arch = "gpt2";
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_kv_head = n_head;
  s.n_embd = n_embd;
  s.vocab_size = vocab;
  s.padded_vocab_size = static_cast<int>(round_up(vocab, padded_multiple));
  s.max_seq_len = max_seq_len;
  s.ffn_hidden = 4 * n_embd;
  s.tied_embeddings = true;
  s.norm_eps = 1e-5f;
  return s;
}

ModelSpec llama_spec(int n_layer, int n_head, int n_kv_head, int n_embd, int ffn, int vocab, bool tied,
                     float rope_theta = 500000.0f) {
  ModelSpec s;
  s.arch = "llama";
  s.n_layer = n_layer;
  s.n_head = n_head;
  s.n_kv_head = n_kv_head;
  s.n_embd = n_embd;
  s.vocab_size = vocab;
  s.padded_vocab_size = static_cast<int>(round_up(vocab, 128));
  s.max_seq_len = 512;
  s.ffn_hidden = ffn;
  s.tied_embeddings = tied;
  s.norm_eps = 1e-5f;
  s.rope_theta = rope_theta;
  return s;
}

// Random values for every element of every tensor (norms and biases too, so no transpose or offset error hides behind
// a constant), zero in the alignment gaps and the padded vocabulary rows, as our weights always are.
std::vector<float> random_weights(const ModelSpec& spec, uint32_t seed) {
  const ParamTable table = build_param_table(spec);
  std::vector<float> v(table.total_elements, 0.0f);
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const ParamInfo& p : table.params) {
    size_t n = p.numel;
    if (p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead)
      n = static_cast<size_t>(spec.vocab_size) * static_cast<size_t>(p.shape[1]);
    for (size_t i = 0; i < n; i++) v[p.offset + i] = normal(gen);
  }
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

json read_json(const std::string& path) { return json::parse(read_file(path)); }
void write_json(const std::string& path, const json& j) { write_file(path, j.dump(2)); }

// x rounded to bf16, nearest even (finite x).
float bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return bf16_bits_to_float(static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

class InteropTest : public llmc_test::TempDirTest {
 protected:

  // Rewrites dir/model.safetensors with the tensors edit() leaves in (name, dtype, shape, bytes) form.
  struct Tensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  static std::vector<Tensor> read_tensors(const std::string& file) {
    SafetensorsReader r(file);
    std::vector<Tensor> out;
    for (const TensorEntry& e : r.tensors()) out.push_back({e.name, e.dtype, e.shape, r.read_bytes(e.name)});
    return out;
  }
  static void write_tensors(const std::string& file, const std::vector<Tensor>& tensors) {
    SafetensorsWriter w;
    for (const Tensor& t : tensors) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    w.set_metadata("format", "pt");
    w.write(file);
  }

};

// ------------------------------------------------------------------------------------------------------------------
// Mapping

TEST(InteropMapping, Gpt2Conv1DAndVocabulary) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 50257, 64);
  const ParamTable table = build_param_table(spec);
  int transposed = 0;
  for (const ParamInfo& p : table.params) {
    const HfTensorMapping m = hf_mapping(spec, p);
    EXPECT_EQ(m.hf_name, p.name);
    // Every GPT-2 linear weight is a Conv1D in Hugging Face; nothing else is transposed.
    EXPECT_EQ(m.transposed, p.role == ParamRole::LinearWeight) << p.name;
    if (m.transposed) {
      transposed++;
      EXPECT_EQ(m.hf_shape, (std::vector<int64_t>{p.shape[1], p.shape[0]})) << p.name;
    }
  }
  EXPECT_EQ(transposed, 4 * spec.n_layer);
  const HfTensorMapping wte = hf_mapping(spec, table.get("transformer.wte.weight"));
  EXPECT_TRUE(wte.vocab_rows);
  EXPECT_EQ(wte.hf_shape, (std::vector<int64_t>{50257, 128}));  // never padded
  EXPECT_EQ(hf_mapping(spec, table.get("transformer.h.1.attn.c_attn.weight")).hf_shape,
            (std::vector<int64_t>{128, 384}));
  EXPECT_EQ(hf_mapping(spec, table.get("transformer.h.1.mlp.c_proj.weight")).hf_shape,
            (std::vector<int64_t>{512, 128}));
}

TEST(InteropMapping, WeightDtypeNames) {
  EXPECT_EQ(parse_weight_dtype("float32"), WeightDtype::F32);
  EXPECT_EQ(parse_weight_dtype("bf16"), WeightDtype::BF16);
  EXPECT_STREQ(weight_dtype_name(WeightDtype::BF16), "bfloat16");
  EXPECT_TRUE(contains(thrown_error([] { parse_weight_dtype("fp8"); }), "choices: float32, bfloat16"));
}

// ------------------------------------------------------------------------------------------------------------------
// Hugging Face round trips

struct RoundTripCase {
  const char* label;
  ModelSpec spec;
  WeightDtype dtype;
};

class HfRoundTrip : public InteropTest, public ::testing::WithParamInterface<RoundTripCase> {};

TEST_P(HfRoundTrip, ExportImportExportIsByteIdentical) {
  const RoundTripCase& c = GetParam();
  const ParamTable table = build_param_table(c.spec);
  const std::vector<float> weights = random_weights(c.spec, 7);
  export_hf(path("a"), c.spec, weights.data(), c.dtype);
  const ModelWeights imported = import_hf(path("a"));
  EXPECT_EQ(imported.spec.arch, c.spec.arch);
  EXPECT_EQ(imported.spec.n_layer, c.spec.n_layer);
  EXPECT_EQ(imported.spec.n_head, c.spec.n_head);
  EXPECT_EQ(imported.spec.n_kv_head, c.spec.n_kv_head);
  EXPECT_EQ(imported.spec.n_embd, c.spec.n_embd);
  EXPECT_EQ(imported.spec.vocab_size, c.spec.vocab_size);
  EXPECT_EQ(imported.spec.padded_vocab_size, c.spec.padded_vocab_size);  // both padded to a multiple of 128
  EXPECT_EQ(imported.spec.max_seq_len, c.spec.max_seq_len);
  EXPECT_EQ(imported.spec.ffn_hidden, c.spec.ffn_hidden);
  EXPECT_EQ(imported.spec.norm_eps, c.spec.norm_eps);
  EXPECT_EQ(imported.spec.tied_embeddings, c.spec.tied_embeddings);
  EXPECT_EQ(imported.spec.rope_theta, c.spec.arch == "llama" ? c.spec.rope_theta : ModelSpec().rope_theta);
  ASSERT_EQ(imported.values.size(), weights.size());
  // F32: lossless. BF16: every value rounded to nearest even once; padding rows and gaps stay 0.
  size_t mismatches = 0;
  for (size_t i = 0; i < weights.size(); i++) {
    const float want = c.dtype == WeightDtype::F32 ? weights[i] : bf16_round(weights[i]);
    mismatches += imported.values[i] != want;
  }
  EXPECT_EQ(mismatches, 0u);

  export_hf(path("b"), imported.spec, imported.values.data(), c.dtype);
  EXPECT_EQ(read_file(path("a/model.safetensors")), read_file(path("b/model.safetensors")));
  EXPECT_EQ(read_file(path("a/config.json")), read_file(path("b/config.json")));
  // And a third time from the second import: stable.
  const ModelWeights again = import_hf(path("b"));
  EXPECT_EQ(again.values, imported.values);
}

INSTANTIATE_TEST_SUITE_P(
    Specs, HfRoundTrip,
    ::testing::Values(RoundTripCase{"gpt2_v50257_hs64_f32", gpt2_spec(2, 2, 128, 50257, 64), WeightDtype::F32},
                      RoundTripCase{"gpt2_v50257_hs64_bf16", gpt2_spec(2, 2, 128, 50257, 64), WeightDtype::BF16},
                      RoundTripCase{"gpt2_v1000_hs128_f32", gpt2_spec(3, 2, 256, 1000, 32), WeightDtype::F32},
                      RoundTripCase{"gpt2_v1000_hs128_bf16", gpt2_spec(3, 2, 256, 1000, 32), WeightDtype::BF16},
                      RoundTripCase{"llama_v1000_hs64_gqa_untied_f32", llama_spec(2, 4, 2, 256, 704, 1000, false),
                                    WeightDtype::F32},
                      RoundTripCase{"llama_v1000_hs64_gqa_untied_bf16", llama_spec(2, 4, 2, 256, 704, 1000, false),
                                    WeightDtype::BF16},
                      RoundTripCase{"llama_v50257_hs128_gqa_tied_f32", llama_spec(2, 4, 1, 512, 1376, 50257, true),
                                    WeightDtype::F32},
                      RoundTripCase{"llama_v50257_hs128_mha_tied_bf16",
                                    llama_spec(1, 2, 2, 256, 688, 50257, true, 10000.0f), WeightDtype::BF16}),
    [](const ::testing::TestParamInfo<RoundTripCase>& info) { return std::string(info.param.label); });

TEST_F(InteropTest, HfTensorsByNameHaveHuggingFaceShapesAndValues) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 1000, 64);
  const ParamTable table = build_param_table(spec);
  const std::vector<float> w = random_weights(spec, 3);
  export_hf(path("hf"), spec, w.data(), WeightDtype::F32);
  SafetensorsReader r(path("hf/model.safetensors"));
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.tensors().size(), table.params.size());  // no lm_head: tied
  EXPECT_FALSE(r.has("lm_head.weight"));

  // c_attn: ours (3C, C) (out, in); Hugging Face Conv1D (C, 3C) (in, out): hf[i][o] == ours[o][i].
  const int C = spec.n_embd;
  const ParamInfo& qkv = table.get("transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(r.entry(qkv.name).shape, (std::vector<int64_t>{C, 3 * C}));
  const std::vector<float> hf = r.read_as_float(qkv.name);
  for (int o = 0; o < 3 * C; o += 37)
    for (int i = 0; i < C; i += 11) ASSERT_EQ(hf[(size_t)i * 3 * C + o], w[qkv.offset + (size_t)o * C + i]);
  const ParamInfo& fcproj = table.get("transformer.h.0.mlp.c_proj.weight");  // ours (C, 4C) -> hf (4C, C)
  EXPECT_EQ(r.entry(fcproj.name).shape, (std::vector<int64_t>{4 * C, C}));
  const std::vector<float> hf2 = r.read_as_float(fcproj.name);
  for (int o = 0; o < C; o += 13)
    for (int i = 0; i < 4 * C; i += 29) ASSERT_EQ(hf2[(size_t)i * C + o], w[fcproj.offset + (size_t)o * 4 * C + i]);
  // Not transposed: biases, norms, wpe. wte: the real rows only.
  const ParamInfo& wte = table.get("transformer.wte.weight");
  EXPECT_EQ(r.entry(wte.name).shape, (std::vector<int64_t>{1000, C}));
  const std::vector<float> e = r.read_as_float(wte.name);
  EXPECT_TRUE(std::equal(e.begin(), e.end(), w.begin() + wte.offset));
  const ParamInfo& bias = table.get("transformer.h.1.attn.c_attn.bias");
  const std::vector<float> b = r.read_as_float(bias.name);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), w.begin() + bias.offset));

  const json config = read_json(path("hf/config.json"));
  EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["vocab_size"], 1000);
  EXPECT_EQ(config["n_positions"], 64);
  EXPECT_EQ(config["n_ctx"], 64);
  EXPECT_EQ(config["n_inner"], 4 * C);
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["layer_norm_epsilon"].dump(), "1e-05");
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_FALSE(config.contains("eos_token_id"));  // a 1000-token vocabulary has no GPT-2 <|endoftext|>
}

TEST_F(InteropTest, LlamaTensorsByNameAndConfig) {
  const ModelSpec spec = llama_spec(2, 4, 2, 256, 704, 1000, /*tied=*/false, 250000.0f);
  const ParamTable table = build_param_table(spec);
  const std::vector<float> w = random_weights(spec, 59);
  export_hf(path("hf"), spec, w.data(), WeightDtype::F32);
  SafetensorsReader r(path("hf/model.safetensors"));
  EXPECT_EQ(r.tensors().size(), table.params.size());
  // LlamaForCausalLM uses nn.Linear: nothing is transposed; k/v have the grouped-query width.
  for (const ParamInfo& p : table.params) {
    const TensorEntry& e = r.entry(p.name);
    std::vector<int64_t> want = p.shape;
    if (p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead) want[0] = 1000;
    EXPECT_EQ(e.shape, want) << p.name;
    const std::vector<float> v = r.read_as_float(p.name);
    EXPECT_TRUE(std::equal(v.begin(), v.end(), w.begin() + p.offset)) << p.name;
  }
  EXPECT_EQ(r.entry("model.layers.1.self_attn.q_proj.weight").shape, (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(r.entry("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(r.entry("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{256, 704}));
  EXPECT_EQ(r.entry("lm_head.weight").shape, (std::vector<int64_t>{1000, 256}));
  const json c = read_json(path("hf/config.json"));
  EXPECT_EQ(c["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["hidden_size"], 256);
  EXPECT_EQ(c["intermediate_size"], 704);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["num_attention_heads"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["head_dim"], 64);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["max_position_embeddings"], 512);
  EXPECT_EQ(c["rms_norm_eps"].dump(), "1e-05");
  EXPECT_EQ(c["rope_theta"].dump(), "250000.0");
  EXPECT_TRUE(c["rope_scaling"].is_null());
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["torch_dtype"], "float32");

  // Tied: no lm_head.weight in the file.
  const ModelSpec tied = llama_spec(1, 2, 1, 128, 352, 1000, true);
  const std::vector<float> wt = random_weights(tied, 61);
  export_hf(path("tied"), tied, wt.data(), WeightDtype::F32);
  EXPECT_FALSE(SafetensorsReader(path("tied/model.safetensors")).has("lm_head.weight"));
  EXPECT_EQ(read_json(path("tied/config.json"))["tie_word_embeddings"], true);
}

TEST_F(InteropTest, LlamaConfigVariantsAndErrors) {
  const ModelSpec spec = llama_spec(1, 2, 1, 128, 352, 1000, false, 10000.0f);
  const std::vector<float> w = random_weights(spec, 67);
  const std::string hf = path("hf"), config_path = hf + "/config.json";
  export_hf(hf, spec, w.data(), WeightDtype::F32);
  const json good = read_json(config_path);
  auto with = [&](const std::function<void(json&)>& edit) {
    json c = good;
    edit(c);
    write_json(config_path, c);
  };
  // transformers 5.x writes rope_parameters; defaults apply for absent keys (num_key_value_heads = heads...).
  with([](json& c) {
    c.erase("rope_theta");
    c.erase("rope_scaling");
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  });
  EXPECT_EQ(import_hf(hf).values, w);
  with([](json& c) { c.erase("architectures"); });  // model_type alone is enough
  EXPECT_EQ(import_hf(hf).spec.arch, "llama");

  std::string msg;
  with([](json& c) { c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; });
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, config_path) && contains(msg, "RoPE scaling 'llama3'")) << msg;
  with([](json& c) { c["hidden_act"] = "gelu"; });
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "hidden_act 'gelu'")) << msg;
  with([](json& c) { c["attention_bias"] = true; });
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "attention_bias")) << msg;
  with([](json& c) { c["head_dim"] = 128; });
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "head_dim 128")) << msg;
  with([](json& c) { c["num_key_value_heads"] = 3; });
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "not divisible by num_key_value_heads 3")) << msg;
  // tie_word_embeddings true while the file holds an lm_head that differs from the embedding.
  with([](json& c) { c["tie_word_embeddings"] = true; });
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "lm_head.weight") && contains(msg, "tied")) << msg;
  // Untied config but no lm_head in the file.
  write_json(config_path, good);
  std::vector<Tensor> t = read_tensors(hf + "/model.safetensors");
  t.erase(std::remove_if(t.begin(), t.end(), [](const Tensor& x) { return x.name == "lm_head.weight"; }), t.end());
  write_tensors(hf + "/model.safetensors", t);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "missing: lm_head.weight")) << msg;

  // llm.c files hold GPT-2 only.
  msg = thrown_error([&] { export_llmc(path("l.bin"), spec, w.data(), WeightDtype::F32); });
  EXPECT_TRUE(contains(msg, "l.bin") && contains(msg, "GPT-2 models only") && contains(msg, "--export-hf")) << msg;
}

TEST_F(InteropTest, Bf16ExportRoundsToNearestEvenOnce) {
  const ModelSpec spec = gpt2_spec(1, 2, 128, 1000, 16);
  const ParamTable table = build_param_table(spec);
  std::vector<float> w = random_weights(spec, 5);
  const ParamInfo& lnf = table.get("transformer.ln_f.weight");
  const float tie_down = 1.0f + std::ldexp(1.0f, -8);       // halfway between 1 and 1 + 2^-7: even is 1
  const float tie_up = 1.0f + 3 * std::ldexp(1.0f, -8);     // halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6
  const float above = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20);  // just above a tie: up
  w[lnf.offset + 0] = tie_down;
  w[lnf.offset + 1] = tie_up;
  w[lnf.offset + 2] = above;
  w[lnf.offset + 3] = -tie_up;
  export_hf(path("bf"), spec, w.data(), WeightDtype::BF16);
  const ModelWeights m = import_hf(path("bf"));
  EXPECT_EQ(m.values[lnf.offset + 0], 1.0f);
  EXPECT_EQ(m.values[lnf.offset + 1], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(m.values[lnf.offset + 2], 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(m.values[lnf.offset + 3], -(1.0f + std::ldexp(1.0f, -6)));
  EXPECT_EQ(SafetensorsReader(path("bf/model.safetensors")).entry(lnf.name).dtype, "BF16");
  EXPECT_EQ(read_json(path("bf/config.json"))["torch_dtype"], "bfloat16");
  // Lossy once: an F32 export of the imported values holds exactly the rounded values; BF16 again is stable.
  export_hf(path("bf2"), m.spec, m.values.data(), WeightDtype::BF16);
  EXPECT_EQ(read_file(path("bf/model.safetensors")), read_file(path("bf2/model.safetensors")));
}

TEST_F(InteropTest, HfAndLlmcCrossRoundTrip) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 50257, 64);
  const std::vector<float> w = random_weights(spec, 11);
  export_hf(path("hf"), spec, w.data(), WeightDtype::F32);
  const ModelWeights from_hf = import_hf(path("hf"));
  export_llmc(path("m.bin"), from_hf.spec, from_hf.values.data(), WeightDtype::F32);
  const ModelWeights from_llmc = import_llmc(path("m.bin"));
  export_hf(path("hf2"), from_llmc.spec, from_llmc.values.data(), WeightDtype::F32);
  EXPECT_EQ(read_file(path("hf/model.safetensors")), read_file(path("hf2/model.safetensors")));
  EXPECT_EQ(read_file(path("hf/config.json")), read_file(path("hf2/config.json")));
  EXPECT_EQ(from_llmc.values, w);
}

// ------------------------------------------------------------------------------------------------------------------
// Hugging Face directories written by others

TEST_F(InteropTest, HfShardedCheckpointImports) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 1000, 64);
  const std::vector<float> w = random_weights(spec, 13);
  export_hf(path("single"), spec, w.data(), WeightDtype::BF16);
  // Split into two shards + index, as save_pretrained(max_shard_size=...) does.
  const std::vector<Tensor> tensors = read_tensors(path("single/model.safetensors"));
  fs::create_directories(path("sharded"));
  fs::copy_file(path("single/config.json"), path("sharded/config.json"));
  std::vector<Tensor> first(tensors.begin(), tensors.begin() + tensors.size() / 2),
      second(tensors.begin() + tensors.size() / 2, tensors.end());
  write_tensors(path("sharded/model-00001-of-00002.safetensors"), first);
  write_tensors(path("sharded/model-00002-of-00002.safetensors"), second);
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (const Tensor& t : first) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const Tensor& t : second) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  write_json(path("sharded/model.safetensors.index.json"), index);
  const ModelWeights a = import_hf(path("single")), b = import_hf(path("sharded"));
  EXPECT_EQ(a.values, b.values);

  // An index that names the wrong shard for a tensor.
  index["weight_map"][first[0].name] = "model-00002-of-00002.safetensors";
  write_json(path("sharded/model.safetensors.index.json"), index);
  const std::string msg = thrown_error([&] { import_hf(path("sharded")); });
  EXPECT_TRUE(contains(msg, "model.safetensors.index.json") && contains(msg, first[0].name) &&
              contains(msg, "model-00002-of-00002.safetensors")) << msg;
}

TEST_F(InteropTest, HfHubStyleGpt2Imports) {
  // openai-community/gpt2 style: GPT2Model names without "transformer.", the causal-mask buffers saved, F16 tensors,
  // and an older checkpoint's explicit copy of the tied lm_head.
  const ModelSpec spec = gpt2_spec(2, 2, 128, 1000, 64);
  const std::vector<float> w = random_weights(spec, 17);
  export_hf(path("hf"), spec, w.data(), WeightDtype::F32);
  std::vector<Tensor> tensors = read_tensors(path("hf/model.safetensors"));
  std::vector<Tensor> hub;
  std::vector<float> wte;
  for (Tensor t : tensors) {
    if (t.name == "transformer.wte.weight") {
      wte.resize(t.bytes.size() / 4);
      std::memcpy(wte.data(), t.bytes.data(), t.bytes.size());
    }
    t.name = t.name.substr(std::string("transformer.").size());
    hub.push_back(t);
  }
  std::vector<uint8_t> mask(64 * 64, 1);
  hub.push_back({"h.0.attn.bias", "U8", {1, 1, 64, 64}, mask});
  hub.push_back({"h.1.attn.bias", "U8", {1, 1, 64, 64}, mask});
  hub.push_back({"lm_head.weight", "F32", {1000, 128}, std::vector<uint8_t>(
      reinterpret_cast<const uint8_t*>(wte.data()), reinterpret_cast<const uint8_t*>(wte.data() + wte.size()))});
  write_tensors(path("hf/model.safetensors"), hub);
  const ModelWeights m = import_hf(path("hf"));
  EXPECT_EQ(m.values, w);

  // A lm_head that is not the embedding contradicts tie_word_embeddings.
  hub.back().bytes[0] ^= 0x40;
  write_tensors(path("hf/model.safetensors"), hub);
  const std::string msg = thrown_error([&] { import_hf(path("hf")); });
  EXPECT_TRUE(contains(msg, "lm_head.weight") && contains(msg, "tied") && contains(msg, "model.safetensors")) << msg;
}

// ------------------------------------------------------------------------------------------------------------------
// Hugging Face errors

TEST_F(InteropTest, HfErrorsNameTheFileAndTheProblem) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 1000, 64);
  const std::vector<float> w = random_weights(spec, 19);
  const std::string hf = path("hf");
  auto fresh = [&] {
    fs::remove_all(hf);
    export_hf(hf, spec, w.data(), WeightDtype::F32);
  };
  std::string msg;

  msg = thrown_error([&] { import_hf(path("nope")); });
  EXPECT_TRUE(contains(msg, "nope") && contains(msg, "not a directory")) << msg;

  fresh();
  fs::remove(hf + "/config.json");
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "has no config.json")) << msg;

  fresh();
  fs::remove(hf + "/model.safetensors");
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "neither model.safetensors nor model.safetensors.index.json")) << msg;

  // Unknown architecture.
  fresh();
  json config = read_json(hf + "/config.json");
  config["model_type"] = "mistral";
  config["architectures"] = {"MistralForCausalLM"};
  write_json(hf + "/config.json", config);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "config.json") && contains(msg, "unknown architecture") && contains(msg, "mistral") &&
              contains(msg, "MistralForCausalLM")) << msg;

  // A config key the model cannot honour, a missing key, an invalid config.
  fresh();
  config = read_json(hf + "/config.json");
  config["activation_function"] = "gelu";
  write_json(hf + "/config.json", config);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "config.json") && contains(msg, "activation_function 'gelu'")) << msg;
  config = read_json(hf + "/config.json");
  config.erase("activation_function");
  config.erase("n_embd");
  write_json(hf + "/config.json", config);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "config.json") && contains(msg, "'n_embd' is missing")) << msg;
  write_file(hf + "/config.json", "{\"model_type\": \"gpt2\",");
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "config.json") && contains(msg, "invalid JSON")) << msg;
}

TEST_F(InteropTest, HfTensorErrorsNameTheTensor) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 1000, 64);
  const std::vector<float> w = random_weights(spec, 23);
  const std::string hf = path("hf"), file = hf + "/model.safetensors";
  export_hf(hf, spec, w.data(), WeightDtype::F32);
  const std::vector<Tensor> good = read_tensors(file);
  std::string msg;

  // Missing tensor.
  std::vector<Tensor> t = good;
  t.erase(t.begin() + 3);
  const std::string removed = good[3].name;
  write_tensors(file, t);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, file) && contains(msg, "missing") && contains(msg, removed)) << msg;

  // Unexpected tensor.
  t = good;
  t.push_back({"transformer.h.2.ln_1.weight", "F32", {128}, std::vector<uint8_t>(512, 0)});
  write_tensors(file, t);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, file) && contains(msg, "unexpected tensor 'transformer.h.2.ln_1.weight'")) << msg;

  // Shape mismatch: the Conv1D weight stored (out, in) instead of (in, out).
  t = good;
  for (Tensor& x : t)
    if (x.name == "transformer.h.0.attn.c_attn.weight") x.shape = {384, 128};
  write_tensors(file, t);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, file) && contains(msg, "'transformer.h.0.attn.c_attn.weight' has shape [384, 128]") &&
              contains(msg, "[128, 384]")) << msg;

  // A padded vocabulary is not a Hugging Face vocabulary.
  t = good;
  for (Tensor& x : t)
    if (x.name == "transformer.wte.weight") {
      x.shape = {1024, 128};
      x.bytes.resize(1024 * 128 * 4, 0);
    }
  write_tensors(file, t);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "'transformer.wte.weight' has shape [1024, 128]") && contains(msg, "[1000, 128]")) << msg;

  // Unsupported dtype.
  t = good;
  for (Tensor& x : t)
    if (x.name == "transformer.ln_f.bias") x.dtype = "I32";
  write_tensors(file, t);
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, "'transformer.ln_f.bias' is I32") && contains(msg, file)) << msg;

  // A corrupt safetensors file: the reader names it.
  write_file(file, read_file(file).substr(0, 100));
  msg = thrown_error([&] { import_hf(hf); });
  EXPECT_TRUE(contains(msg, file)) << msg;
}

TEST_F(InteropTest, HfExportRefusesAShadowingIndex) {
  const ModelSpec spec = gpt2_spec(1, 2, 128, 1000, 16);
  const std::vector<float> w = random_weights(spec, 1);
  fs::create_directories(path("hf"));
  write_file(path("hf/model.safetensors.index.json"), "{}");
  const std::string msg = thrown_error([&] { export_hf(path("hf"), spec, w.data(), WeightDtype::F32); });
  EXPECT_TRUE(contains(msg, "model.safetensors.index.json") && contains(msg, "empty directory")) << msg;
  EXPECT_FALSE(fs::exists(path("hf/config.json")));
}

// ------------------------------------------------------------------------------------------------------------------
// llm.c

class LlmcRoundTrip : public InteropTest, public ::testing::WithParamInterface<RoundTripCase> {};

TEST_P(LlmcRoundTrip, ExportImportExportIsByteIdentical) {
  const RoundTripCase& c = GetParam();
  const std::vector<float> w = random_weights(c.spec, 29);
  export_llmc(path("a.bin"), c.spec, w.data(), c.dtype);
  const ModelWeights m = import_llmc(path("a.bin"));
  EXPECT_EQ(m.spec.padded_vocab_size, c.spec.padded_vocab_size);
  EXPECT_EQ(m.spec.vocab_size, c.spec.vocab_size);
  EXPECT_EQ(m.spec.n_layer, c.spec.n_layer);
  EXPECT_EQ(m.spec.n_head, c.spec.n_head);
  EXPECT_EQ(m.spec.n_embd, c.spec.n_embd);
  EXPECT_EQ(m.spec.max_seq_len, c.spec.max_seq_len);
  size_t mismatches = 0;
  for (size_t i = 0; i < w.size(); i++)
    mismatches += m.values[i] != (c.dtype == WeightDtype::F32 ? w[i] : bf16_round(w[i]));
  EXPECT_EQ(mismatches, 0u);
  export_llmc(path("b.bin"), m.spec, m.values.data(), c.dtype);
  EXPECT_EQ(read_file(path("a.bin")), read_file(path("b.bin")));
}

INSTANTIATE_TEST_SUITE_P(
    Specs, LlmcRoundTrip,
    ::testing::Values(RoundTripCase{"v50257_hs64_v3", gpt2_spec(2, 2, 128, 50257, 64), WeightDtype::F32},
                      RoundTripCase{"v50257_hs64_v5", gpt2_spec(2, 2, 128, 50257, 64), WeightDtype::BF16},
                      RoundTripCase{"v1000_hs128_v3", gpt2_spec(3, 2, 256, 1000, 32), WeightDtype::F32},
                      RoundTripCase{"v1000_hs128_v5_pad64", gpt2_spec(3, 2, 256, 1000, 32, 64), WeightDtype::BF16}),
    [](const ::testing::TestParamInfo<RoundTripCase>& info) { return std::string(info.param.label); });

// The file layout, read independently of the importer: header, then the 16 tensors stacked over layers in llm.c's
// order, (out, in) matrices as ours, padded wte rows zero.
TEST_F(InteropTest, LlmcFileLayoutIsLlmcs) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 1000, 16);
  const ParamTable table = build_param_table(spec);
  std::vector<float> w = random_weights(spec, 31);
  // Non-zero padding in our buffer is not exported: llm.c's padded rows are zeros.
  const ParamInfo& wte = table.get("transformer.wte.weight");
  w[wte.offset + wte.numel - 1] = 5.0f;
  export_llmc(path("m.bin"), spec, w.data(), WeightDtype::F32);
  const std::string bytes = read_file(path("m.bin"));
  const int L = 2, C = 128, V = 1000, Vp = 1024, T = 16;
  const size_t n_params = (size_t)Vp * C + (size_t)T * C + L * (size_t)(C + C + 3 * C * C + 3 * C + C * C + C + C +
                                                                        C + 4 * C * C + 4 * C + 4 * C * C + C) +
                          2 * C;
  ASSERT_EQ(bytes.size(), 1024 + n_params * 4);
  int32_t h[256];
  std::memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(h[0], 20240326);
  EXPECT_EQ(h[1], 3);
  EXPECT_EQ(h[2], T);
  EXPECT_EQ(h[3], V);
  EXPECT_EQ(h[4], L);
  EXPECT_EQ(h[5], 2);
  EXPECT_EQ(h[6], C);
  EXPECT_EQ(h[7], Vp);
  for (int i = 8; i < 256; i++) ASSERT_EQ(h[i], 0);
  const float* f = reinterpret_cast<const float*>(bytes.data() + 1024);
  auto expect_block = [&](size_t at, const std::string& name) {
    const ParamInfo& p = table.get(name);
    EXPECT_EQ(0, std::memcmp(f + at, w.data() + p.offset, p.numel * 4)) << name << " at " << at;
  };
  size_t at = 0;
  // wte (Vp, C): the V real rows, then zeros.
  EXPECT_EQ(0, std::memcmp(f, w.data() + wte.offset, (size_t)V * C * 4));
  for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) ASSERT_EQ(f[i], 0.0f);
  at += (size_t)Vp * C;
  expect_block(at, "transformer.wpe.weight");
  at += (size_t)T * C;
  const std::pair<const char*, size_t> stacked[] = {
      {"ln_1.weight", C},         {"ln_1.bias", C},          {"attn.c_attn.weight", 3 * C * C},
      {"attn.c_attn.bias", 3 * C}, {"attn.c_proj.weight", C * C}, {"attn.c_proj.bias", C},
      {"ln_2.weight", C},         {"ln_2.bias", C},          {"mlp.c_fc.weight", 4 * C * C},
      {"mlp.c_fc.bias", 4 * C},   {"mlp.c_proj.weight", 4 * C * C}, {"mlp.c_proj.bias", C}};
  for (const auto& [suffix, per_layer] : stacked)
    for (int l = 0; l < L; l++, at += per_layer)
      expect_block(at, "transformer.h." + std::to_string(l) + "." + suffix);
  expect_block(at, "transformer.ln_f.weight");
  expect_block(at + C, "transformer.ln_f.bias");
  EXPECT_EQ(at + 2 * C, n_params);
}

TEST_F(InteropTest, LlmcErrorsNameTheFile) {
  const ModelSpec spec = gpt2_spec(1, 2, 128, 1000, 16);
  const std::vector<float> w = random_weights(spec, 37);
  const std::string file = path("m.bin");
  export_llmc(file, spec, w.data(), WeightDtype::BF16);
  const std::string good = read_file(file);
  std::string msg;
  auto with_int = [&](int index, int32_t value) {
    std::string b = good;
    std::memcpy(&b[index * 4], &value, 4);
    write_file(file, b);
    return thrown_error([&] { import_llmc(file); });
  };
  msg = with_int(0, 12345);
  EXPECT_TRUE(contains(msg, file) && contains(msg, "bad magic 12345") && contains(msg, "20240326")) << msg;
  msg = with_int(0, 20240520);
  EXPECT_TRUE(contains(msg, "token shard")) << msg;
  msg = with_int(0, 20240803);
  EXPECT_TRUE(contains(msg, "Llama 3") && contains(msg, "Hugging Face")) << msg;
  msg = with_int(1, 4);
  EXPECT_TRUE(contains(msg, file) && contains(msg, "version 4 is not supported")) << msg;
  msg = with_int(4, 0);
  EXPECT_TRUE(contains(msg, "header field L = 0")) << msg;
  msg = with_int(7, 999);
  EXPECT_TRUE(contains(msg, "inconsistent header")) << msg;
  msg = with_int(1, 3);  // a BF16 file's size read as FP32
  EXPECT_TRUE(contains(msg, file) && contains(msg, "truncated")) << msg;
  write_file(file, good.substr(0, good.size() - 2));
  msg = thrown_error([&] { import_llmc(file); });
  EXPECT_TRUE(contains(msg, file) && contains(msg, "truncated")) << msg;
  write_file(file, good.substr(0, 100));
  msg = thrown_error([&] { import_llmc(file); });
  EXPECT_TRUE(contains(msg, "too short for the 1024-byte header")) << msg;
  msg = thrown_error([&] { import_llmc(path("missing.bin")); });
  EXPECT_TRUE(contains(msg, "missing.bin")) << msg;

  // Specs llm.c cannot represent.
  ModelSpec wide = spec;
  wide.ffn_hidden = 3 * spec.n_embd;
  const std::vector<float> ww = random_weights(wide, 1);
  msg = thrown_error([&] { export_llmc(path("wide.bin"), wide, ww.data(), WeightDtype::F32); });
  EXPECT_TRUE(contains(msg, "wide.bin") && contains(msg, "ffn_hidden") && contains(msg, "--export-hf")) << msg;
  ModelSpec eps = spec;
  eps.norm_eps = 1e-6f;
  msg = thrown_error([&] { export_llmc(path("eps.bin"), eps, w.data(), WeightDtype::F32); });
  EXPECT_TRUE(contains(msg, "norm_eps")) << msg;
  EXPECT_FALSE(fs::exists(path("wide.bin")) || fs::exists(path("eps.bin")) || fs::exists(path("eps.bin.tmp")));
}

// ------------------------------------------------------------------------------------------------------------------
// Weights for a run

RunConfig tiny_config(const std::vector<std::string>& overrides = {}) {
  const json j = {{"model", {{"preset", "gpt2-tiny"}}},
                  {"data", {{"train", "data/x_*.bin"}}},
                  {"train", {{"seq_len", 64}}}};
  return load_config_json(j, overrides);
}

TEST_F(InteropTest, DetectsTheFormat) {
  const RunConfig cfg = tiny_config();
  const std::vector<float> w = random_weights(cfg.model, 41);
  export_hf(path("hf"), cfg.model, w.data(), WeightDtype::F32);
  export_llmc(path("m.bin"), cfg.model, w.data(), WeightDtype::F32);
  EXPECT_EQ(detect_weights_format(path("hf")), WeightsFormat::HuggingFace);
  EXPECT_EQ(detect_weights_format(path("m.bin")), WeightsFormat::Llmc);
  EXPECT_EQ(detect_weights_format(path("hf/model.safetensors")), WeightsFormat::Llm8);
  EXPECT_EQ(detect_weights_format(dir_), WeightsFormat::Llm8);
  EXPECT_TRUE(contains(thrown_error([&] { detect_weights_format(path("none")); }), "does not exist"));
  EXPECT_TRUE(contains(thrown_error([&] { load_weights(dir_, cfg.model, nullptr); }), "neither config.json"));
}

TEST_F(InteropTest, LoadWeightsChecksTheSpecAndRepadsTheVocabulary) {
  const RunConfig cfg = tiny_config();  // vocab 50257 padded to 50304
  const ParamTable table = build_param_table(cfg.model);
  const std::vector<float> w = random_weights(cfg.model, 43);
  // Written with another padding (64): the run's padding is re-done on load.
  ModelSpec other = cfg.model;
  other.padded_vocab_size = static_cast<int>(round_up(other.vocab_size, 64));
  const ParamTable other_table = build_param_table(other);
  std::vector<float> w_other(other_table.total_elements, 0.0f);
  for (const ParamInfo& p : table.params) {
    const ParamInfo& q = other_table.get(p.name);
    std::copy(w.begin() + p.offset, w.begin() + p.offset + std::min(p.numel, q.numel), w_other.begin() + q.offset);
  }
  export_llmc(path("m.bin"), other, w_other.data(), WeightDtype::F32);
  export_hf(path("hf"), cfg.model, w.data(), WeightDtype::F32);
  std::vector<float> loaded(table.total_elements, -1.0f);
  EXPECT_TRUE(contains(load_weights(path("m.bin"), cfg.model, loaded.data()), "llm.c model file"));
  EXPECT_EQ(loaded, w);
  std::fill(loaded.begin(), loaded.end(), -1.0f);
  EXPECT_TRUE(contains(load_weights(path("hf"), cfg.model, loaded.data()), "Hugging Face directory"));
  EXPECT_EQ(loaded, w);

  // A config that describes another model: the error names the key and both values.
  const RunConfig deeper = tiny_config({"model.n_layer=3"});
  std::vector<float> buf(build_param_table(deeper.model).total_elements);
  std::string msg = thrown_error([&] { load_weights(path("hf"), deeper.model, buf.data()); });
  EXPECT_TRUE(contains(msg, "config.json") && contains(msg, "model.n_layer = 2") && contains(msg, "says 3")) << msg;
  msg = thrown_error([&] { load_weights(path("m.bin"), deeper.model, buf.data()); });
  EXPECT_TRUE(contains(msg, "m.bin") && contains(msg, "model.n_layer = 2")) << msg;
  const RunConfig eps = tiny_config({"model.norm_eps=1e-6"});
  msg = thrown_error([&] { load_weights(path("hf"), eps.model, loaded.data()); });
  EXPECT_TRUE(contains(msg, "model.norm_eps = 1e-05") && contains(msg, "1e-06")) << msg;
  // Llama: rope_theta and tied_embeddings are part of the model.
  const RunConfig llama = tiny_config({"model.preset=llama-tiny"});
  const std::vector<float> wl = random_weights(llama.model, 71);
  export_hf(path("llama"), llama.model, wl.data(), WeightDtype::BF16);
  std::vector<float> lbuf(build_param_table(llama.model).total_elements);
  EXPECT_TRUE(contains(load_weights(path("llama"), llama.model, lbuf.data()), "(llama)"));
  const RunConfig theta = tiny_config({"model.preset=llama-tiny", "model.rope_theta=500000"});
  msg = thrown_error([&] { load_weights(path("llama"), theta.model, lbuf.data()); });
  EXPECT_TRUE(contains(msg, "model.rope_theta = 10000.0") && contains(msg, "500000.0")) << msg;
  const RunConfig tied = tiny_config({"model.preset=llama-tiny", "model.tied_embeddings=true"});
  msg = thrown_error([&] { load_weights(path("llama"), tied.model, lbuf.data()); });
  EXPECT_TRUE(contains(msg, "model.tied_embeddings = false")) << msg;
  msg = thrown_error([&] { load_weights(path("hf"), llama.model, lbuf.data()); });
  EXPECT_TRUE(contains(msg, "model.arch = \"gpt2\"") && contains(msg, "\"llama\"")) << msg;

  const RunConfig vocab = tiny_config({"model.vocab_size=50000"});
  msg = thrown_error([&] { load_weights(path("m.bin"), vocab.model, loaded.data()); });
  EXPECT_TRUE(contains(msg, "model.vocab_size = 50257")) << msg;

  // Our own model.safetensors: by name, F32, the table's shape.
  SafetensorsWriter ours;
  for (const ParamInfo& p : table.params) ours.add(p.name, "F32", p.shape, w.data() + p.offset, p.numel * 4);
  ours.write(path("model.safetensors"));
  std::fill(loaded.begin(), loaded.end(), -1.0f);
  EXPECT_TRUE(contains(load_weights(path("model.safetensors"), cfg.model, loaded.data()), "llm8 weights"));
  EXPECT_EQ(loaded, w);
  msg = thrown_error([&] { load_weights(path("hf/model.safetensors"), cfg.model, loaded.data()); });
  EXPECT_TRUE(contains(msg, "hf/model.safetensors") && contains(msg, "transformer.wte.weight") &&
              contains(msg, "[50257, 128]")) << msg;
}

TEST_F(InteropTest, RunStartWeightsFollowTheTrainersOrder) {
  const std::string run = path("run");
  RunConfig cfg = tiny_config({"checkpoint.dir=" + run});
  const ParamTable table = build_param_table(cfg.model);
  std::vector<float> values(table.total_elements);

  // 1. No checkpoint, no init_from: the seeded initialisation.
  EXPECT_TRUE(contains(run_start_weights(cfg, values.data()), "fresh initialisation (train.seed = 42)"));
  std::vector<float> expected(table.total_elements);
  init_parameters(table, 42, expected.data());
  EXPECT_EQ(values, expected);

  // 2. init_from when there is no checkpoint.
  const std::vector<float> w = random_weights(cfg.model, 47);
  export_hf(path("hf"), cfg.model, w.data(), WeightDtype::F32);
  cfg.train.init_from = path("hf");
  EXPECT_TRUE(contains(run_start_weights(cfg, values.data()), "train.init_from: Hugging Face directory"));
  EXPECT_EQ(values, w);

  // 3. A checkpoint wins over init_from, as in the trainer.
  const std::vector<float> ck = random_weights(cfg.model, 53);
  {
    CheckpointWriter writer(run, 7);
    SafetensorsWriter model;
    for (const ParamInfo& p : table.params) model.add(p.name, "F32", p.shape, ck.data() + p.offset, p.numel * 4);
    model.write(writer.file_path("model.safetensors"));
    TrainerState state;
    state.step = 7;
    state.config = config_to_json(cfg);
    writer.commit(state, 0);
  }
  const std::string source = run_start_weights(cfg, values.data());
  EXPECT_TRUE(contains(source, "step_00000007") && contains(source, "(step 7)")) << source;
  EXPECT_EQ(values, ck);

  // A checkpoint of another model is refused naming the key.
  RunConfig wider = tiny_config({"checkpoint.dir=" + run, "model.max_seq_len=128"});
  std::vector<float> buf(build_param_table(wider.model).total_elements);
  const std::string msg = thrown_error([&] { run_start_weights(wider, buf.data()); });
  EXPECT_TRUE(contains(msg, "step_00000007") && contains(msg, "model.max_seq_len")) << msg;

  // checkpoint.resume = none: init_from again.
  cfg.checkpoint.resume = "none";
  EXPECT_TRUE(contains(run_start_weights(cfg, values.data()), "train.init_from"));
  EXPECT_EQ(values, w);
}

// A checkpoint step directory of cfg's model holding weights w, as the trainer writes it.
std::string write_step_dir(const std::string& run, int64_t step, const RunConfig& cfg, const std::vector<float>& w) {
  const ParamTable table = build_param_table(cfg.model);
  CheckpointWriter writer(run, step);
  SafetensorsWriter model;
  for (const ParamInfo& p : table.params) model.add(p.name, "F32", p.shape, w.data() + p.offset, p.numel * 4);
  model.write(writer.file_path("model.safetensors"));
  writer.add_bytes("optimizer_m.safetensors", "m", 1);
  TrainerState state;
  state.step = step;
  state.config = config_to_json(cfg);
  return writer.commit(state, 0);
}

// Flips one byte near the end of a file (inside the last tensor's data).
void flip_last_bytes(const std::string& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-10, std::ios::end);
  const char c = static_cast<char>(f.get());
  f.seekp(-10, std::ios::end);
  f.put(static_cast<char>(c ^ 0x40));
}

TEST_F(InteropTest, InitFromACheckpointVerifiesItLikeAResume) {
  RunConfig cfg = tiny_config();
  const ParamTable table = build_param_table(cfg.model);
  const std::vector<float> w = random_weights(cfg.model, 59);
  const std::string step = write_step_dir(path("run"), 5, cfg, w);
  std::vector<float> values(table.total_elements);
  for (const std::string& source : {step, step + "/model.safetensors"}) {
    cfg.train.init_from = source;
    EXPECT_TRUE(contains(load_init_from(cfg, values.data()), "llm8 weights")) << source;
    EXPECT_EQ(values, w);
  }
  // Corrupt: refused by the checksum, as a resume would, for the directory and for its model.safetensors alike.
  flip_last_bytes(step + "/model.safetensors");
  for (const std::string& source : {step, step + "/model.safetensors"}) {
    cfg.train.init_from = source;
    const std::string msg = thrown_error([&] { load_init_from(cfg, values.data()); });
    EXPECT_TRUE(contains(msg, "train.init_from: checkpoint file " + step + "/model.safetensors is corrupt (checksum "
                              "mismatch)")) << msg;
    // The export path reads train.init_from the same way.
    EXPECT_TRUE(contains(thrown_error([&] { run_start_weights(cfg, values.data()); }), "checksum mismatch"));
  }
  // Incomplete (no DONE): refused too.
  const std::string fresh = write_step_dir(path("run2"), 6, cfg, w);
  fs::remove(fresh + "/DONE");
  cfg.train.init_from = fresh;
  const std::string msg = thrown_error([&] { load_init_from(cfg, values.data()); });
  EXPECT_TRUE(contains(msg, "train.init_from: checkpoint " + fresh + " is incomplete")) << msg;
  // A model.safetensors outside a checkpoint is read as before (nothing to verify it against).
  fs::create_directories(path("loose"));
  fs::copy_file(fresh + "/model.safetensors", path("loose/model.safetensors"));
  cfg.train.init_from = path("loose/model.safetensors");
  EXPECT_NO_THROW(load_init_from(cfg, values.data()));
}

TEST_F(InteropTest, NonFiniteInitWeightsAreRefusedNamingTheTensorAndTheElement) {
  RunConfig cfg = tiny_config();
  const ParamTable table = build_param_table(cfg.model);
  std::vector<float> w = random_weights(cfg.model, 61);
  const ParamInfo& qkv = table.get("transformer.h.1.attn.c_attn.weight");  // (3C, C) = (384, 128)
  w[qkv.offset + 5 * 128 + 7] = std::nanf("");
  export_hf(path("hf"), cfg.model, w.data(), WeightDtype::F32);  // Conv1D: stored transposed, mapped back by name
  export_llmc(path("m.bin"), cfg.model, w.data(), WeightDtype::BF16);
  write_step_dir(path("run"), 1, cfg, w);
  std::vector<float> values(table.total_elements);
  for (const std::string& source : {path("hf"), path("m.bin"), llmc::step_dir_path(path("run"), 1)}) {
    cfg.train.init_from = source;
    const std::string msg = thrown_error([&] { load_init_from(cfg, values.data()); });
    EXPECT_TRUE(contains(msg, "transformer.h.1.attn.c_attn.weight[5, 7] = nan") &&
                contains(msg, "train.allow_nonfinite_init") && contains(msg, source))
        << msg;
    EXPECT_TRUE(contains(thrown_error([&] { run_start_weights(cfg, values.data()); }), "[5, 7] = nan")) << source;
  }
  // Infinities too (BF16 has them).
  std::vector<float> inf = random_weights(cfg.model, 67);
  inf[table.get("transformer.ln_f.weight").offset + 3] = -INFINITY;
  export_llmc(path("inf.bin"), cfg.model, inf.data(), WeightDtype::BF16);
  cfg.train.init_from = path("inf.bin");
  EXPECT_TRUE(contains(thrown_error([&] { load_init_from(cfg, values.data()); }), "transformer.ln_f.weight[3] = -inf"));
  // The switch lets them in.
  cfg.train.allow_nonfinite_init = true;
  cfg.train.init_from = path("hf");
  EXPECT_TRUE(contains(load_init_from(cfg, values.data()), "Hugging Face directory"));
  EXPECT_TRUE(std::isnan(values[qkv.offset + 5 * 128 + 7]));
}

TEST_F(InteropTest, ExportsNeverWriteIntoACheckpointAndOverwriteOnlyWithForce) {
  const RunConfig cfg = tiny_config({"checkpoint.dir=" + path("run")});
  const std::string step = write_step_dir(path("run"), 5, cfg, random_weights(cfg.model, 71));
  const std::string model_before = read_file(step + "/model.safetensors");
  for (bool force : {false, true}) {
    std::string msg = thrown_error([&] { export_run_weights(cfg, step, "", WeightDtype::F32, force); });
    EXPECT_TRUE(contains(msg, "--export-hf " + step + " is a checkpoint step directory")) << msg;
    msg = thrown_error([&] { export_run_weights(cfg, "", step + "/gpt2.bin", WeightDtype::F32, force); });
    EXPECT_TRUE(contains(msg, "checkpoint step directory " + step)) << msg;
  }
  EXPECT_EQ(read_file(step + "/model.safetensors"), model_before);
  EXPECT_FALSE(fs::exists(step + "/gpt2.bin") || fs::exists(step + "/config.json"));
  EXPECT_EQ(verify_checkpoint(step).step, 5);

  // A non-empty directory, an existing file: only with --force.
  fs::create_directories(path("hf"));
  write_file(path("hf/notes.txt"), "mine");
  write_file(path("m.bin"), "mine");
  std::string msg = thrown_error([&] { export_run_weights(cfg, path("hf"), "", WeightDtype::F32, false); });
  EXPECT_TRUE(contains(msg, path("hf") + " is not empty") && contains(msg, "--force")) << msg;
  msg = thrown_error([&] { export_run_weights(cfg, "", path("m.bin"), WeightDtype::F32, false); });
  EXPECT_TRUE(contains(msg, path("m.bin") + " exists") && contains(msg, "--force")) << msg;
  EXPECT_FALSE(fs::exists(path("hf/model.safetensors")));
  EXPECT_EQ(read_file(path("m.bin")), "mine");
  EXPECT_EQ(export_run_weights(cfg, path("hf"), path("m.bin"), WeightDtype::F32, true), 0);
  EXPECT_TRUE(fs::exists(path("hf/model.safetensors")) && fs::exists(path("hf/config.json")));
  EXPECT_EQ(detect_weights_format(path("m.bin")), WeightsFormat::Llmc);

  // Something that is not a regular file is never replaced; a new or empty target needs no --force.
  msg = thrown_error([&] { export_run_weights(cfg, "", "/dev/null", WeightDtype::F32, true); });
  EXPECT_TRUE(contains(msg, "/dev/null exists and is not a regular file")) << msg;
  fs::create_directories(path("empty"));
  EXPECT_EQ(export_run_weights(cfg, path("empty"), path("new.bin"), WeightDtype::F32, false), 0);
  EXPECT_TRUE(fs::exists(path("empty/config.json")) && fs::exists(path("new.bin")));
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// Hostile files: sizes that lie about the file, JSON that is too deep or repeats a key, FIFOs. Each check runs in a
// child process with a time and an address-space limit: the sizes used to be allocated before they were checked.

// An llm.c header (FP32) with the given maxT, V, L, NH, C, Vp and nothing after it.
std::string llmc_header(int32_t max_t, int32_t v, int32_t l, int32_t nh, int32_t c, int32_t vp) {
  std::string bytes(1024, '\0');
  const int32_t fields[] = {kLlmcModelMagic, kLlmcVersionF32, max_t, v, l, nh, c, vp};
  std::memcpy(&bytes[0], fields, sizeof fields);
  return bytes;
}

TEST_F(InteropTest, LlmcHeadersThatLieAboutTheFileAllocateNothing) {
  const std::string file = path("lying.bin");
  // 2^24 layers in a 1 KB file (was 6 GB and 20 s of parameter table before std::bad_alloc).
  write_file(file, llmc_header(1024, 50257, 1 << 24, 12, 768, 50304));
  llmc_test::expect_bounded_error([&] { import_llmc(file); },
                                  {file, "the model's n_layer is 16777216, more than the 1024"}, 1, 256ull << 20);
  // Every size within its bound, the file far too short: refused from its size before the weights are allocated.
  write_file(file, llmc_header(1 << 20, 1 << 24, 1024, 1024, 65536, 1 << 24));
  llmc_test::expect_bounded_error([&] { import_llmc(file); }, {file, "is 1024 bytes", "truncated"}, 2, 256ull << 20);
  write_file(file, llmc_header(1024, 50257, 12, 1024, 1 << 24, 50304));
  llmc_test::expect_bounded_error([&] { import_llmc(file); }, {file, "n_embd is 16777216, more than the 65536"}, 1,
                                  256ull << 20);
  // Through load_weights (train.init_from) too.
  const RunConfig cfg = tiny_config();
  llmc_test::expect_bounded_error([&] { load_weights(file, cfg.model, nullptr); }, {file, "more than the 65536"}, 1,
                                  256ull << 20);
}

TEST_F(InteropTest, HfConfigsThatLieAboutTheWeightsAllocateNothing) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 1000, 64);
  const std::vector<float> w = random_weights(spec, 61);
  const std::string hf = path("hf");
  export_hf(hf, spec, w.data(), WeightDtype::F32);
  const json good = read_json(hf + "/config.json");
  auto import_with = [&](const std::function<void(json&)>& edit) {
    json c = good;
    edit(c);
    write_json(hf + "/config.json", c);
    return [&] { import_hf(hf); };
  };
  // A one-line config with 2^30 layers: refused from the bound (was the parameter table, then std::bad_alloc).
  llmc_test::expect_bounded_error(import_with([](json& c) { c["n_layer"] = 1 << 30; }),
                                  {"config.json: 'n_layer' must be a positive integer of at most 16777216"}, 1,
                                  256ull << 20);
  llmc_test::expect_bounded_error(import_with([](json& c) { c["n_layer"] = 100000; }),
                                  {"config.json: the model's n_layer is 100000, more than the 1024"}, 1, 256ull << 20);
  // n_embd whose 4 * n_embd default FFN width wrapped an int.
  llmc_test::expect_bounded_error(import_with([](json& c) { c.erase("n_inner"); c["n_embd"] = 1 << 30; }),
                                  {"'n_embd' must be a positive integer of at most 16777216"}, 1, 256ull << 20);
  // Sizes within the bounds describing ~2^41 bytes of weights, next to a file of a few hundred KB: refused before
  // the weights are allocated.
  llmc_test::expect_bounded_error(import_with([](json& c) {
                                    c["n_layer"] = 1024;
                                    c["n_embd"] = 65536;
                                    c["n_head"] = 1024;
                                    c["n_inner"] = 262144;
                                    c["vocab_size"] = 16777216;
                                  }),
                                  {"needs at least", "bytes of weights, but the files hold",
                                   "config.json does not describe these weights"},
                                  2, 256ull << 20);
}

TEST_F(InteropTest, HfJsonFilesAreReadWithTheChecks) {
  const ModelSpec spec = gpt2_spec(2, 2, 128, 1000, 64);
  const std::vector<float> w = random_weights(spec, 67);
  const std::string hf = path("hf");
  export_hf(hf, spec, w.data(), WeightDtype::F32);
  const std::string config_text = read_file(hf + "/config.json");
  // A key twice (the last won silently), deep nesting, a number that does not fit.
  write_file(hf + "/config.json", "{\"n_layer\": 2,\n\"n_layer\": 12," + config_text.substr(1));
  EXPECT_TRUE(contains(thrown_error([&] { import_hf(hf); }), hf + "/config.json: duplicate key 'n_layer' (line 2)"));
  write_file(hf + "/config.json", "{\"task_specific_params\": " + std::string(100000, '[') + "}");
  llmc_test::expect_bounded_error([&] { import_hf(hf); }, {"config.json: JSON nested deeper than 64 levels"}, 2);
  write_file(hf + "/config.json", "{\"layer_norm_epsilon\": 1e999," + config_text.substr(1));
  EXPECT_TRUE(contains(thrown_error([&] { import_hf(hf); }), "the number 1e999 of 'layer_norm_epsilon'"));
  // config.json as a FIFO: refused, never opened for reading.
  fs::remove(hf + "/config.json");
  llmc_test::make_fifo(hf + "/config.json");
  llmc_test::expect_bounded_error([&] { import_hf(hf); }, {"config.json' is a FIFO"}, 2);
  fs::remove(hf + "/config.json");
  write_file(hf + "/config.json", config_text);

  // A sharded checkpoint whose index maps a tensor twice, or whose shard is a FIFO.
  const std::string weights = hf + "/model.safetensors", shard = hf + "/model-00001-of-00001.safetensors";
  fs::rename(weights, shard);
  json map = json::object();
  const SafetensorsReader shard_reader(shard);
  for (const TensorEntry& e : shard_reader.tensors()) map[e.name] = fs::path(shard).filename().string();
  const std::string index = json{{"weight_map", map}}.dump(1);
  write_file(hf + "/model.safetensors.index.json",
             "{\"weight_map\": {\"transformer.wpe.weight\": \"x\",\n" + index.substr(index.find('{', 1) + 1));
  EXPECT_TRUE(contains(thrown_error([&] { import_hf(hf); }), "duplicate key 'weight_map.transformer.wpe.weight'"));
  write_file(hf + "/model.safetensors.index.json", index);
  EXPECT_NO_THROW(import_hf(hf));
  fs::remove(shard);
  llmc_test::make_fifo(shard);
  llmc_test::expect_bounded_error([&] { import_hf(hf); }, {shard, "is a FIFO"}, 2);
}

TEST_F(InteropTest, FifosAsModelFilesAreRefusedWithoutBlocking) {
  const RunConfig cfg = tiny_config();
  const std::string fifo = path("model.bin");
  llmc_test::make_fifo(fifo);
  llmc_test::expect_bounded_error([&] { import_llmc(fifo); }, {"llm.c model file '" + fifo + "' is a FIFO"}, 2);
  llmc_test::expect_bounded_error([&] { detect_weights_format(fifo); }, {"model file '" + fifo + "' is a FIFO"}, 2);
  llmc_test::expect_bounded_error([&] { load_weights(fifo, cfg.model, nullptr); }, {fifo, "is a FIFO"}, 2);
  // A step directory whose model.safetensors is a FIFO.
  fs::create_directories(path("step"));
  llmc_test::make_fifo(path("step/model.safetensors"));
  llmc_test::expect_bounded_error([&] { load_weights(path("step"), cfg.model, nullptr); },
                                  {path("step/model.safetensors"), "is a FIFO"}, 2);
}
