// test/run/test_config: the run config: parsing, defaults, presets, --set overrides (with type conversion), the
// resolved-config round trip, every validation error (message names the key, unknown keys get a suggestion), hostile
// input (deep nesting in files, --set values and built documents; duplicate keys at several depths; numbers that do
// not fit; the upper bound of every size key and the checked derived sizes; the largest config's exact sizes; FIFOs,
// directories and devices as config paths; time and memory bounds where the old failure was a blow-up), the shipped
// configs/*.json and the key reference in configs/README.md.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <sstream>

#include "llmc/core/common.h"
#include "llmc/model/model_spec.h"
#include "llmc/run/cli.h"
#include "llmc/run/config.h"
#include "llmc/run/memory_plan.h"
#include "test/support/bounded_run.h"
#include "test/support/error_of.h"
#include "test/support/temp_dir.h"

using llmc_test::error_of;
using llmc::RunConfig;
using nlohmann::json;

namespace {

const std::string kSourceDir = LLM8_SOURCE_DIR;

// A small valid config: the tiny preset with a short context so batch arithmetic is easy to follow.
json base_config() {
  return json::parse(R"({
    "model": {"preset": "gpt2-tiny"},
    "data": {"train": "data/x/x_train_*.bin", "val": "data/x/x_val_*.bin"},
    "train": {"micro_batch": 2, "seq_len": 64, "steps": 10, "warmup_steps": 1}
  })");
}

// The message of the llmc::Error that loading throws, or "" when it loads.
std::string load_error(const json& j, const std::vector<std::string>& overrides = {}, int world_size = 1) {
  try {
    llmc::load_config_json(j, overrides, world_size);
  } catch (const llmc::Error& e) {
    return e.what();
  }
  return "";
}

// base_config() with one key replaced.
json with(const std::string& section, const std::string& key, const json& value) {
  json j = base_config();
  j[section][key] = value;
  return j;
}

void expect_error(const std::string& message, const std::vector<std::string>& parts) {
  ASSERT_FALSE(message.empty()) << "expected an error containing '" << parts.front() << "'";
  for (const std::string& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Parsing and defaults

TEST(Config, DefaultsComeFromTheStructs) {
  json j = {{"data", {{"train", "a_*.bin"}}}, {"train", {{"seq_len", 256}}}};
  RunConfig cfg = llmc::load_config_json(j, {});
  RunConfig defaults;
  EXPECT_EQ(cfg.model_preset, "");
  EXPECT_EQ(cfg.model.n_layer, 12);  // without a preset: gpt2-124m's shape
  EXPECT_EQ(cfg.model.n_embd, 768);
  EXPECT_EQ(cfg.model.n_kv_head, 12);
  EXPECT_EQ(cfg.model.ffn_hidden, 3072);
  EXPECT_EQ(cfg.model.padded_vocab_size, 50304);
  EXPECT_EQ(cfg.train.micro_batch, defaults.train.micro_batch);
  EXPECT_EQ(cfg.train.steps, defaults.train.steps);
  EXPECT_DOUBLE_EQ(cfg.train.lr, 6e-4);
  EXPECT_EQ(cfg.train.schedule, "cosine");
  EXPECT_DOUBLE_EQ(cfg.optimizer.beta2, 0.95);
  EXPECT_EQ(cfg.checkpoint.resume, "auto");
  EXPECT_EQ(cfg.precision.recipe, "bf16");
  EXPECT_EQ(cfg.data.seed, 1337);
  EXPECT_TRUE(cfg.data.shuffle);
  EXPECT_EQ(cfg.sample.tokens, 64);
  EXPECT_EQ(cfg.log.every, 1);
  EXPECT_EQ(cfg.train.global_batch_tokens, 4 * 256);  // 0 resolves to micro_batch * seq_len * world
  EXPECT_EQ(cfg.grad_accum_steps, 1);
}

TEST(Config, KeyDocsDefaultsMatchStructs) {
  std::vector<llmc::ConfigKeyDoc> docs = llmc::config_key_docs();
  auto doc = [&](const std::string& key) {
    for (const auto& d : docs)
      if (d.key == key) return d;
    ADD_FAILURE() << "no doc for " << key;
    return llmc::ConfigKeyDoc{};
  };
  EXPECT_EQ(docs.size(), 90u);  // 13 model keys + 29 precision keys + the 48 fields of the other sections
  EXPECT_EQ(doc("checkpoint.overwrite").default_value, "false");
  EXPECT_EQ(doc("train.allow_nonfinite_init").default_value, "false");
  EXPECT_EQ(doc("precision.bf16_layers").type, "int list");
  EXPECT_EQ(doc("precision.bf16_layers").default_value, "[]");
  EXPECT_EQ(doc("precision.dy_format").default_value, "\"e5m2\"");
  EXPECT_EQ(doc("precision.x_granularity").default_value, "\"tensor\"");
  EXPECT_EQ(doc("precision.dy_rounding").default_value, "\"nearest\"");
  EXPECT_EQ(doc("precision.wgrad_hadamard").default_value, "0");
  EXPECT_EQ(doc("precision.backward_scale").default_value, "\"absmax\"");
  EXPECT_EQ(doc("precision.forward_scale").default_value, "\"absmax\"");
  EXPECT_EQ(doc("precision.trust_mask").default_value, "false");
  EXPECT_EQ(doc("precision.forward_hadamard").default_value, "0");
  EXPECT_EQ(doc("precision.forward_signs").default_value, "\"none\"");
  EXPECT_EQ(doc("precision.backward_hadamard").default_value, "0");
  EXPECT_EQ(doc("precision.nonlinear_fp8").default_value, "false");
  EXPECT_EQ(doc("train.lr").default_value, json(6e-4).dump());
  EXPECT_EQ(doc("train.lr").type, "float");
  EXPECT_EQ(doc("train.steps").default_value, "100");
  EXPECT_EQ(doc("train.steps").type, "int");
  EXPECT_EQ(doc("data.shuffle").default_value, "true");
  EXPECT_EQ(doc("train.schedule").default_value, "\"cosine\"");
  EXPECT_EQ(doc("model.padded_vocab_multiple").default_value, "128");
  EXPECT_EQ(doc("model.norm_eps").default_value, "1e-05");
  for (const auto& d : docs) EXPECT_FALSE(d.help.empty()) << d.key;
}

TEST(Config, ReadsEveryValueType) {
  json j = base_config();
  j["train"]["lr"] = 3e-4;
  j["train"]["global_batch_tokens"] = 1024;
  j["train"]["deterministic"] = false;
  j["checkpoint"]["dir"] = "runs/x";
  j["train"]["steps"] = 1e3;  // an integral number written as a float is accepted for an int key
  RunConfig cfg = llmc::load_config_json(j, {});
  EXPECT_DOUBLE_EQ(cfg.train.lr, 3e-4);
  EXPECT_EQ(cfg.train.global_batch_tokens, 1024);
  EXPECT_EQ(cfg.grad_accum_steps, 1024 / (2 * 64));
  EXPECT_FALSE(cfg.train.deterministic);
  EXPECT_EQ(cfg.checkpoint.dir, "runs/x");
  EXPECT_EQ(cfg.train.steps, 1000);
}

TEST(Config, GradAccumDependsOnWorldSize) {
  json j = with("train", "global_batch_tokens", 2 * 64 * 4 * 3);
  EXPECT_EQ(llmc::load_config_json(j, {}, 1).grad_accum_steps, 12);
  EXPECT_EQ(llmc::load_config_json(j, {}, 4).grad_accum_steps, 3);
  EXPECT_EQ(llmc::load_config_json(base_config(), {}, 4).train.global_batch_tokens, 2 * 64 * 4);
}

TEST(Config, LoadsFromFileWithComments) {
  std::string path = testing::TempDir() + "llm8_config_comments.json";
  std::ofstream(path) << "{ // a comment\n \"model\": {\"preset\": \"gpt2-tiny\"},\n"
                         " \"data\": {\"train\": \"a_*.bin\"}, \"train\": {\"seq_len\": 128}}\n";
  RunConfig cfg = llmc::load_config(path, {});
  EXPECT_EQ(cfg.model.n_layer, 2);
  EXPECT_EQ(cfg.train.seq_len, 128);
}

// ---------------------------------------------------------------------------------------------------------------
// Presets

TEST(Config, EveryModelPresetLoads) {
  struct Expected {
    const char* name;
    int layers, embd, heads, kv_heads, ffn, context;
    bool tied;
    float theta;
  };
  const Expected presets[] = {
      {"gpt2-tiny", 2, 128, 2, 2, 512, 256, true, 10000.0f},
      {"gpt2-mini", 6, 384, 6, 6, 1536, 512, true, 10000.0f},
      {"gpt2-124m", 12, 768, 12, 12, 3072, 1024, true, 10000.0f},
      {"gpt2-350m", 24, 1024, 16, 16, 4096, 1024, true, 10000.0f},
      {"gpt2-774m", 36, 1280, 20, 20, 5120, 1024, true, 10000.0f},
      {"gpt2-1558m", 48, 1600, 25, 25, 6400, 1024, true, 10000.0f},
      {"llama-tiny", 2, 128, 2, 1, 512, 256, false, 10000.0f},
      {"llama-125m", 12, 768, 12, 4, 2048, 2048, true, 500000.0f},
      {"llama-350m", 24, 1024, 16, 4, 2816, 2048, true, 500000.0f},
      {"llama-1b", 16, 2048, 32, 8, 8192, 2048, true, 500000.0f},
      {"llama-3b", 28, 3072, 24, 8, 8192, 2048, true, 500000.0f},
      {"llama-7b", 32, 4096, 32, 32, 11008, 4096, false, 10000.0f}};
  EXPECT_EQ(llmc::model_preset_names().size(), std::size(presets));
  for (const Expected& p : presets) {
    json j = with("model", "preset", p.name);
    j["train"]["seq_len"] = 64;
    RunConfig cfg = llmc::load_config_json(j, {});
    EXPECT_EQ(cfg.model_preset, p.name);
    EXPECT_EQ(cfg.model.arch, std::string(p.name).substr(0, std::string(p.name).find('-'))) << p.name;
    EXPECT_EQ(cfg.model.n_layer, p.layers) << p.name;
    EXPECT_EQ(cfg.model.n_embd, p.embd) << p.name;
    EXPECT_EQ(cfg.model.n_head, p.heads) << p.name;
    EXPECT_EQ(cfg.model.n_kv_head, p.kv_heads) << p.name;
    EXPECT_EQ(cfg.model.max_seq_len, p.context) << p.name;
    EXPECT_EQ(cfg.model.ffn_hidden, p.ffn) << p.name;
    EXPECT_EQ(cfg.model.tied_embeddings, p.tied) << p.name;
    EXPECT_FLOAT_EQ(cfg.model.rope_theta, p.theta) << p.name;
    EXPECT_EQ(cfg.model.vocab_size, 50257) << p.name;
    EXPECT_EQ(cfg.model.padded_vocab_size, 50304) << p.name;
  }
}

// Keys that follow others (n_kv_head follows n_head, ffn_hidden follows n_embd and the arch) keep a preset's value
// unless the key they follow is given; without a preset they are always derived.
TEST(Config, LlamaDerivedKeys) {
  json j = with("model", "preset", "llama-1b");
  RunConfig cfg = llmc::load_config_json(j, {});
  EXPECT_EQ(cfg.model.n_kv_head, 8);
  EXPECT_EQ(cfg.model.ffn_hidden, 8192);
  cfg = llmc::load_config_json(j, {"model.n_layer=4"});  // unrelated key: the preset's sizes stay
  EXPECT_EQ(cfg.model.n_kv_head, 8);
  EXPECT_EQ(cfg.model.ffn_hidden, 8192);
  cfg = llmc::load_config_json(j, {"model.n_head=16"});  // head size 128, n_kv_head follows n_head
  EXPECT_EQ(cfg.model.n_kv_head, 16);
  cfg = llmc::load_config_json(j, {"model.n_head=16", "model.n_kv_head=4"});
  EXPECT_EQ(cfg.model.n_kv_head, 4);
  cfg = llmc::load_config_json(j, {"model.n_embd=1024", "model.n_head=16"});  // the 8C/3 rule, rounded up to 256
  EXPECT_EQ(cfg.model.ffn_hidden, 2816);
  // No preset: gpt2-124m's shape with the llama rules.
  json k = base_config();
  k["model"] = {{"arch", "llama"}};
  k["train"]["seq_len"] = 64;
  cfg = llmc::load_config_json(k, {});
  EXPECT_EQ(cfg.model.arch, "llama");
  EXPECT_EQ(cfg.model.n_kv_head, 12);
  EXPECT_EQ(cfg.model.ffn_hidden, 2048);
  EXPECT_TRUE(cfg.model.tied_embeddings);
  EXPECT_FLOAT_EQ(cfg.model.rope_theta, 10000.0f);
  // Llama 3's own vocabulary: already a multiple of 128.
  cfg = llmc::load_config_json(j, {"model.vocab_size=128256"});
  EXPECT_EQ(cfg.model.padded_vocab_size, 128256);
  cfg = llmc::load_config_json(j, {"model.tied_embeddings=false", "model.rope_theta=10000"});
  EXPECT_FALSE(cfg.model.tied_embeddings);
  EXPECT_FLOAT_EQ(cfg.model.rope_theta, 10000.0f);
}

TEST(Config, ExplicitModelKeysOverrideThePreset) {
  json j = with("model", "preset", "gpt2-124m");
  j["model"]["n_layer"] = 4;
  j["model"]["n_embd"] = 1024;
  j["model"]["n_head"] = 16;
  RunConfig cfg = llmc::load_config_json(j, {});
  EXPECT_EQ(cfg.model_preset, "gpt2-124m");
  EXPECT_EQ(cfg.model.n_layer, 4);
  EXPECT_EQ(cfg.model.n_embd, 1024);
  EXPECT_EQ(cfg.model.n_kv_head, 16);      // follows n_head unless given
  EXPECT_EQ(cfg.model.ffn_hidden, 4096);   // follows n_embd unless given
  EXPECT_EQ(cfg.model.max_seq_len, 1024);  // from the preset
  j["model"]["ffn_hidden"] = 2048;
  EXPECT_EQ(llmc::load_config_json(j, {}).model.ffn_hidden, 2048);
}

TEST(Config, PaddedVocabRoundsUp) {
  json j = with("model", "vocab_size", 1000);
  EXPECT_EQ(llmc::load_config_json(j, {}).model.padded_vocab_size, 1024);
  j["model"]["padded_vocab_multiple"] = 1;
  EXPECT_EQ(llmc::load_config_json(j, {}).model.padded_vocab_size, 1000);
  j["model"]["padded_vocab_multiple"] = 64;
  j["model"]["vocab_size"] = 1025;
  EXPECT_EQ(llmc::load_config_json(j, {}).model.padded_vocab_size, 1088);
}

TEST(Config, RecipeNames) {
  EXPECT_EQ(llmc::recipe_names(),
            (std::vector<std::string>{"bf16", "fp8_tensorwise", "fp8_delayed", "fp8_blockwise", "nvfp4", "mxfp4",
                                      "coat"}));
  EXPECT_EQ(llmc::load_config_json(with("precision", "recipe", "bf16"), {}).precision.recipe, "bf16");
}

// The FP4 keys: an E2M1 role takes the scales its block implies whatever order the keys come in, the nvfp4 preset's
// switches are keys, and the resolved config reloads to the same recipe.
TEST(Config, Fp4RolesAndSwitches) {
  llmc::RunConfig c = llmc::load_config_json(with("precision", "recipe", "nvfp4"), {});
  EXPECT_EQ(c.precision.w, (llmc::Encoding{llmc::ElementFormat::E2M1, llmc::kBlock16x16, llmc::ScaleFormat::E4M3,
                                           true}));
  EXPECT_TRUE(c.precision.dy_stochastic_rounding);
  EXPECT_EQ(c.precision.wgrad_hadamard, 16);
  // The paper's ablations as keys: 1x16 weights, no SR, no RHT.
  c = llmc::load_config_json(with("precision", "recipe", "nvfp4"),
                             {"precision.w_granularity=1x16", "precision.dy_rounding=nearest",
                              "precision.wgrad_hadamard=0"});
  EXPECT_EQ(c.precision.w, c.precision.x);
  EXPECT_FALSE(c.precision.dy_stochastic_rounding);
  EXPECT_EQ(c.precision.wgrad_hadamard, 0);
  // MXFP4 from an FP8 preset, keys in either order: every role E2M1 1x32 with E8M0 scales.
  c = llmc::load_config_json(with("precision", "recipe", "fp8_tensorwise"),
                             {"precision.x_granularity=1x32", "precision.x_format=e2m1", "precision.w_format=e2m1",
                              "precision.w_granularity=1x32", "precision.dy_granularity=1x32",
                              "precision.dy_format=e2m1", "precision.fast_accum=false"});
  const llmc::Encoding mx{llmc::ElementFormat::E2M1, llmc::kBlock1x32, llmc::ScaleFormat::E8M0, false};
  EXPECT_EQ(c.precision.x, mx);
  EXPECT_EQ(c.precision.w, mx);
  EXPECT_EQ(c.precision.dy, mx);
  // Back to FP8: the roles take FP32 scales again (and the FP4-only switches must go).
  c = llmc::load_config_json(with("precision", "recipe", "nvfp4"),
                             {"precision.x_format=e4m3", "precision.x_granularity=tensor", "precision.w_format=e4m3",
                              "precision.w_granularity=tensor", "precision.dy_format=e5m2",
                              "precision.dy_granularity=tensor", "precision.dy_rounding=nearest",
                              "precision.wgrad_hadamard=0"});
  EXPECT_EQ(c.precision.x, (llmc::Encoding{llmc::ElementFormat::E4M3}));
  EXPECT_EQ(c.precision.dy, (llmc::Encoding{llmc::ElementFormat::E5M2}));
  // One role alone cannot leave its family: the GEMM mapping names both operands.
  expect_error(load_error(with("precision", "recipe", "nvfp4"), {"precision.x_format=e4m3"}),
               {"the fprop GEMM", "an FP4 operand multiplies only an operand of its own FP4 family"});
  // The resolved nvfp4 config reloads to the same recipe.
  c = llmc::load_config_json(with("precision", "recipe", "nvfp4"), {"precision.bf16_layers=[0, -1]"});
  const json dumped = llmc::config_to_json(c);
  EXPECT_EQ(dumped["precision"]["dy_rounding"], "stochastic");
  EXPECT_EQ(dumped["precision"]["wgrad_hadamard"], 16);
  EXPECT_EQ(dumped["precision"]["w_granularity"], "16x16");
  const llmc::RunConfig back = llmc::load_config_json(dumped, {});
  EXPECT_EQ(llmc::config_to_json(back), dumped);
  // Switches the recipe cannot take name their key.
  expect_error(load_error(with("precision", "recipe", "fp8_tensorwise"), {"precision.dy_rounding=stochastic"}),
               {"precision.dy_rounding = \"stochastic\" needs FP4 output gradients"});
  expect_error(load_error(with("precision", "recipe", "nvfp4"), {"precision.wgrad_hadamard=8"}),
               {"precision.wgrad_hadamard must be 0 (none), 16 or 32"});
  expect_error(load_error(with("precision", "recipe", "nvfp4"), {"precision.dy_rounding=random"}),
               {"precision.dy_rounding must be one of nearest, stochastic"});
  // The tokens of a micro-batch are a multiple of 16 (whole Hadamard transforms, FP4 GEMM rows).
  json j = with("precision", "recipe", "nvfp4");
  j["train"] = {{"micro_batch", 1}, {"seq_len", 100}};
  expect_error(load_error(j), {"micro_batch * train.seq_len", "multiple of 16"});
}

// precision.tensorwise_products: set with --set or in the file, written back by the resolved config, and its
// errors name the key.
TEST(Config, TensorwiseProducts) {
  using llmc::LinearProduct;
  llmc::RunConfig c = llmc::load_config_json(with("precision", "recipe", "fp8_blockwise"),
                                             {"precision.tensorwise_products=dgrad,wgrad"});
  EXPECT_EQ(c.precision.tensorwise_products, (std::vector<LinearProduct>{LinearProduct::Dgrad, LinearProduct::Wgrad}));
  const json dumped = llmc::config_to_json(c);
  EXPECT_EQ(dumped["precision"]["tensorwise_products"], "dgrad,wgrad");
  EXPECT_EQ(llmc::config_to_json(llmc::load_config_json(dumped, {})), dumped);
  EXPECT_EQ(llmc::config_to_json(llmc::load_config_json(with("precision", "recipe", "fp8_blockwise"), {}))
                ["precision"]["tensorwise_products"], "");
  expect_error(load_error(with("precision", "recipe", "fp8_blockwise"), {"precision.tensorwise_products=fprop,bwd"}),
               {"precision.tensorwise_products = \"fprop,bwd\": 'bwd' is not a product"});
  expect_error(load_error(with("precision", "recipe", "fp8_tensorwise"), {"precision.tensorwise_products=wgrad"}),
               {"precision.tensorwise_products names wgrad", "already has one scale per tensor"});
}

// Quartet's switches are keys: the mxfp4 preset sets them, the ablations unset them, the resolved config reloads to the
// same recipe, and an ingredient without its data flow names the key that enables it.
TEST(Config, QuartetSwitches) {
  llmc::RunConfig c = llmc::load_config_json(with("precision", "recipe", "mxfp4"), {});
  EXPECT_TRUE(c.precision.backward_range_matched);
  EXPECT_EQ(c.precision.forward_hadamard, 32);
  EXPECT_TRUE(c.precision.forward_gaussian_scales);
  EXPECT_TRUE(c.precision.trust_mask);
  EXPECT_EQ(c.precision.backward_hadamard, 32);
  EXPECT_FALSE(c.precision.dy_stochastic_rounding);
  const json dumped = llmc::config_to_json(c);
  EXPECT_EQ(dumped["precision"]["backward_scale"], "range_matched");
  EXPECT_EQ(dumped["precision"]["forward_scale"], "gaussian");
  EXPECT_EQ(dumped["precision"]["forward_hadamard"], 32);
  EXPECT_EQ(dumped["precision"]["forward_signs"], "none");
  EXPECT_EQ(dumped["precision"]["backward_hadamard"], 32);
  EXPECT_EQ(dumped["precision"]["trust_mask"], true);
  EXPECT_EQ(llmc::config_to_json(llmc::load_config_json(dumped, {})), dumped);
  c = llmc::load_config_json(with("precision", "recipe", "mxfp4"),
                             {"precision.dy_rounding=stochastic", "precision.trust_mask=false",
                              "precision.forward_hadamard=0", "precision.backward_hadamard=0",
                              "precision.forward_scale=absmax"});
  EXPECT_TRUE(c.precision.dy_stochastic_rounding);
  EXPECT_FALSE(c.precision.trust_mask);
  EXPECT_EQ(c.precision.forward_hadamard, 0);
  EXPECT_EQ(c.precision.backward_hadamard, 0);
  EXPECT_FALSE(c.precision.forward_gaussian_scales);
  EXPECT_TRUE(c.precision.backward_range_matched);
  expect_error(load_error(with("precision", "recipe", "mxfp4"), {"precision.backward_scale=absmax"}),
               {"precision.forward_hadamard = 32 is an ingredient of Quartet's data flow",
                "set precision.backward_scale = \"range_matched\""});
  expect_error(load_error(with("precision", "recipe", "mxfp4"), {"precision.backward_hadamard=16"}),
               {"precision.backward_hadamard must be 0 (none) or 32 (got 16)"});
  expect_error(load_error(with("precision", "recipe", "mxfp4"), {"precision.forward_scale=sigma"}),
               {"precision.forward_scale must be one of absmax, gaussian"});
  c = llmc::load_config_json(with("precision", "recipe", "mxfp4"), {"precision.forward_signs=random"});
  EXPECT_TRUE(c.precision.forward_random_signs);
  EXPECT_EQ(llmc::config_to_json(c)["precision"]["forward_signs"], "random");
  expect_error(load_error(with("precision", "recipe", "mxfp4"),
                          {"precision.forward_signs=random", "precision.forward_hadamard=0"}),
               {"precision.forward_signs = \"random\" signs the forward Hadamard transform, which is off",
                "set precision.forward_hadamard = 32"});
  expect_error(load_error(with("precision", "recipe", "mxfp4"), {"precision.forward_signs=yes"}),
               {"precision.forward_signs must be one of none, random"});
  expect_error(load_error(with("precision", "recipe", "nvfp4"), {"precision.trust_mask=true"}),
               {"precision.trust_mask = true is an ingredient"});
}

// COAT: the coat preset is fp8_tensorwise's GEMMs with the FP8 non-linear activations, the MLP activation computed
// from its copy and recomputed, the weights' codes made in every pass and FP8 AdamW moments with dynamic range
// expansion; each part is a key of its own that wins over the preset, the resolved config reloads to the same run,
// and the activation switch refuses recompute and widths that are not whole 16-channel groups.
TEST(Config, CoatPresetAndItsParts) {
  llmc::RunConfig c = llmc::load_config_json(with("precision", "recipe", "coat"), {});
  EXPECT_TRUE(llmc::quantizes_linears(c.precision));
  EXPECT_EQ(c.precision.x, (llmc::Encoding{llmc::ElementFormat::E4M3}));
  EXPECT_EQ(c.precision.dy, (llmc::Encoding{llmc::ElementFormat::E5M2}));
  EXPECT_EQ(c.precision.scaling, llmc::ScalingMode::Current);
  EXPECT_TRUE(c.precision.nonlinear_fp8);
  EXPECT_TRUE(c.precision.recompute_mlp_act);
  EXPECT_FALSE(c.precision.cache_weights);
  EXPECT_FALSE(c.precision.cache_weight_transpose);
  EXPECT_STREQ(c.optimizer.state_format.name, "fp8_expand");
  EXPECT_NE(llmc::describe_recipe(c.precision).find("norm / GELU / SwiGLU inputs saved as e4m3 1x16 groups"),
            std::string::npos);
  EXPECT_NE(llmc::describe_recipe(c.precision).find("recomputed in backward"), std::string::npos);
  EXPECT_NE(llmc::describe_recipe(c.precision).find("weight codes made in every forward and backward"),
            std::string::npos);
  // With the weight cache back on, the transposed codes are still made in backward.
  c = llmc::load_config_json(with("precision", "recipe", "coat"), {"precision.cache_weights=true"});
  EXPECT_TRUE(c.precision.cache_weights);
  EXPECT_NE(llmc::describe_recipe(c.precision).find("transposed weight codes made in every backward"),
            std::string::npos);
  // Each part alone: explicit keys win over the preset, whatever their order.
  c = llmc::load_config_json(with("precision", "recipe", "coat"), {"optimizer.state_format=fp32"});
  EXPECT_STREQ(c.optimizer.state_format.name, "fp32");
  EXPECT_TRUE(c.precision.nonlinear_fp8);
  json j = with("precision", "recipe", "coat");
  j["optimizer"] = {{"state_format", "fp8"}};
  EXPECT_STREQ(llmc::load_config_json(j, {}).optimizer.state_format.name, "fp8");
  c = llmc::load_config_json(with("precision", "recipe", "coat"),
                             {"precision.recompute_mlp_act=false", "precision.cache_weight_transpose=true"});
  EXPECT_TRUE(c.precision.nonlinear_fp8);
  EXPECT_FALSE(c.precision.recompute_mlp_act);
  EXPECT_TRUE(c.precision.cache_weight_transpose);
  // Without the copies the recomputation has nothing to start from: the error says to turn it off too.
  expect_error(load_error(with("precision", "recipe", "coat"), {"precision.nonlinear_fp8=false"}),
               {"precision.recompute_mlp_act", "turn recompute_mlp_act off too"});
  c = llmc::load_config_json(with("precision", "recipe", "coat"),
                             {"precision.nonlinear_fp8=false", "precision.recompute_mlp_act=false"});
  EXPECT_FALSE(c.precision.nonlinear_fp8);
  EXPECT_STREQ(c.optimizer.state_format.name, "fp8_expand");
  c = llmc::load_config_json(with("precision", "recipe", "bf16"), {"precision.nonlinear_fp8=true"});
  EXPECT_FALSE(llmc::quantizes_linears(c.precision));
  EXPECT_TRUE(c.precision.nonlinear_fp8);
  EXPECT_STREQ(c.optimizer.state_format.name, "fp32");
  EXPECT_EQ(llmc::describe_recipe(c.precision),
            "bf16 (all GEMMs in BF16; norm / GELU / SwiGLU inputs saved as e4m3 1x16 groups)");
  // The other presets leave the optimizer's default and keep BF16 non-linear inputs.
  for (const std::string& name : llmc::recipe_names()) {
    if (name == "coat") continue;
    c = llmc::load_config_json(with("precision", "recipe", name), {});
    EXPECT_STREQ(c.optimizer.state_format.name, "fp32") << name;
    EXPECT_FALSE(c.precision.nonlinear_fp8) << name;
    EXPECT_FALSE(c.precision.recompute_mlp_act) << name;
    EXPECT_TRUE(c.precision.cache_weight_transpose) << name;
    EXPECT_TRUE(c.precision.cache_weights) << name;
  }
  // The resolved config names every part and reloads to the same config.
  c = llmc::load_config_json(with("precision", "recipe", "coat"), {});
  const json dumped = llmc::config_to_json(c);
  EXPECT_EQ(dumped["precision"]["recipe"], "coat");
  EXPECT_EQ(dumped["precision"]["nonlinear_fp8"], true);
  EXPECT_EQ(dumped["precision"]["recompute_mlp_act"], true);
  EXPECT_EQ(dumped["precision"]["cache_weight_transpose"], false);
  EXPECT_EQ(dumped["precision"]["cache_weights"], false);
  EXPECT_EQ(dumped["optimizer"]["state_format"], "fp8_expand");
  EXPECT_EQ(llmc::config_to_json(llmc::load_config_json(dumped, {})), dumped);
  // Recompute would need the BF16 tensors the copies replace; groups are 16 channels wide.
  expect_error(load_error(with("precision", "recipe", "coat"), {"train.recompute=1"}),
               {"precision.nonlinear_fp8", "train.recompute = 1 cannot recompute", "set train.recompute to 0"});
  json llama = base_config();
  llama["model"] = {{"preset", "llama-tiny"}, {"ffn_hidden", 200}};
  llama["precision"] = {{"nonlinear_fp8", true}};
  expect_error(load_error(llama), {"precision.nonlinear_fp8", "model.ffn_hidden (200)", "multiples of 16"});
  llama["precision"] = {{"nonlinear_fp8", false}};
  EXPECT_EQ(load_error(llama), "");
}

// The recipe preset fills the precision section; explicit keys (file or --set) override single fields.
TEST(Config, RecipePresetAndOverrides) {
  llmc::RunConfig c = llmc::load_config_json(with("precision", "recipe", "fp8_blockwise"), {});
  EXPECT_TRUE(llmc::quantizes_linears(c.precision));
  EXPECT_EQ(c.precision.x.block, llmc::kBlock1x128);
  EXPECT_EQ(c.precision.w.block, llmc::kBlock128x128);
  EXPECT_EQ(c.precision.dy.element, llmc::ElementFormat::E5M2);
  EXPECT_FALSE(c.precision.pow2_scales());
  EXPECT_FALSE(c.precision.fast_accum);
  EXPECT_TRUE(llmc::load_config_json(with("precision", "recipe", "fp8_blockwise"), {"precision.pow2_scales=true"})
                  .precision.pow2_scales());  // DeepSeek-V3's power-of-two scales, one key away

  json j = with("precision", "recipe", "fp8_delayed");
  j["precision"]["amax_history_len"] = 16;
  j["precision"]["bf16_layers"] = json::array({0, -1});
  c = llmc::load_config_json(j, {"precision.margin=1", "precision.dy_format=e4m3"});
  EXPECT_EQ(c.precision.scaling, llmc::ScalingMode::Delayed);
  EXPECT_EQ(c.precision.amax_history_len, 16);
  EXPECT_EQ(c.precision.margin, 1);
  EXPECT_EQ(c.precision.dy.element, llmc::ElementFormat::E4M3);
  EXPECT_EQ(c.precision.bf16_layers, (std::vector<int>{0, -1}));

  // The resolved config reloads to the same precision section (presets expanded, every field explicit).
  const json dumped = llmc::config_to_json(c);
  EXPECT_EQ(dumped["precision"]["recipe"], "fp8_delayed");
  EXPECT_EQ(dumped["precision"]["dy_format"], "e4m3");
  EXPECT_EQ(dumped["precision"]["bf16_layers"], json::array({0, -1}));
  json reload = dumped;
  reload["data"]["train"] = "x";
  EXPECT_EQ(llmc::config_to_json(llmc::load_config_json(reload, {}))["precision"], dumped["precision"]);
}

// ---------------------------------------------------------------------------------------------------------------
// Overrides

TEST(Config, OverridesConvertTypes) {
  RunConfig cfg = llmc::load_config_json(
      base_config(), {"train.lr=3e-4", "train.steps=50", "data.shuffle=false", "data.train=other/*_train_*.bin",
                      "checkpoint.dir=\"runs/quoted\"", "sample.temperature=1", "train.global_batch_tokens=2048",
                      "model.norm_eps=1e-6", "log.jsonl=123"});
  EXPECT_DOUBLE_EQ(cfg.train.lr, 3e-4);
  EXPECT_EQ(cfg.train.steps, 50);
  EXPECT_FALSE(cfg.data.shuffle);
  EXPECT_EQ(cfg.data.train, "other/*_train_*.bin");
  EXPECT_EQ(cfg.checkpoint.dir, "runs/quoted");
  EXPECT_DOUBLE_EQ(cfg.sample.temperature, 1.0);
  EXPECT_EQ(cfg.train.global_batch_tokens, 2048);
  EXPECT_FLOAT_EQ(cfg.model.norm_eps, 1e-6f);
  EXPECT_EQ(cfg.log.jsonl, "123");  // string keys take the text as is
}

TEST(Config, OverridesWinOverTheFileAndApplyInOrder) {
  json j = with("train", "lr", 1e-3);
  RunConfig cfg = llmc::load_config_json(j, {"train.lr=2e-3", "train.lr=5e-4", "eval.batches=7"});
  EXPECT_DOUBLE_EQ(cfg.train.lr, 5e-4);
  EXPECT_EQ(cfg.eval.batches, 7);  // a section absent from the file is created
}

TEST(Config, OverrideCanChangeThePreset) {
  RunConfig cfg = llmc::load_config_json(base_config(), {"model.preset=gpt2-mini"});
  EXPECT_EQ(cfg.model.n_layer, 6);
  EXPECT_EQ(cfg.model.n_embd, 384);
}

// ---------------------------------------------------------------------------------------------------------------
// Round trip

TEST(Config, ToJsonRoundTrips) {
  RunConfig cfg = llmc::load_config_json(
      base_config(), {"train.lr=1.5e-4", "model.n_layer=3", "model.vocab_size=1000", "model.padded_vocab_multiple=64",
                      "train.schedule=wsd", "data.shuffle=false", "model.norm_eps=1e-6",
                      "checkpoint.resume=none", "train.global_batch_tokens=512"});
  json j = llmc::config_to_json(cfg);
  for (const auto& doc : llmc::config_key_docs()) {
    size_t dot = doc.key.find('.');
    EXPECT_TRUE(j[doc.key.substr(0, dot)].contains(doc.key.substr(dot + 1))) << doc.key;
  }
  RunConfig again = llmc::load_config_json(j, {});
  EXPECT_EQ(llmc::config_to_json(again), j);
  EXPECT_EQ(again.model.n_layer, 3);
  EXPECT_EQ(again.model.padded_vocab_size, 1024);
  EXPECT_FLOAT_EQ(again.model.norm_eps, 1e-6f);
  EXPECT_EQ(again.grad_accum_steps, cfg.grad_accum_steps);
  EXPECT_EQ(j["model"]["norm_eps"].dump(), "1e-06");  // floats print short
}

TEST(Config, ShippedConfigsRoundTrip) {
  for (const auto& entry : std::filesystem::directory_iterator(kSourceDir + "/configs")) {
    if (entry.path().extension() != ".json") continue;
    RunConfig cfg = llmc::load_config(entry.path().string(), {});
    json j = llmc::config_to_json(cfg);
    EXPECT_EQ(llmc::config_to_json(llmc::load_config_json(j, {})), j) << entry.path();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Every validation error names the key.

TEST(ConfigErrors, UnknownSectionSuggestsNearest) {
  json j = base_config();
  j["trian"] = {{"lr", 1e-3}};
  expect_error(load_error(j), {"unknown section 'trian'", "did you mean 'train'"});
  json k = base_config();
  k["lr"] = 1e-3;  // a key at the top level
  expect_error(load_error(k), {"unknown section 'lr'", "train.lr"});
  json l = base_config();
  l["zzzzzzzz"] = json::object();
  expect_error(load_error(l), {"unknown section 'zzzzzzzz'", "sections: model, data, train"});
}

TEST(ConfigErrors, UnknownKeySuggestsNearest) {
  expect_error(load_error(with("train", "lrr", 1e-3)), {"unknown key 'train.lrr'", "did you mean 'train.lr'?"});
  expect_error(load_error(with("train", "beta1", 0.9)), {"unknown key 'train.beta1'", "did you mean 'optimizer.beta1'?"});
  expect_error(load_error(with("model", "n_layers", 2)), {"'model.n_layers'", "did you mean 'model.n_layer'?"});
  expect_error(load_error(with("optimizer", "wd", 0.1)), {"'optimizer.wd'", "valid keys in 'optimizer'", "weight_decay"});
  expect_error(load_error(base_config(), {"optimizer.lr=1"}), {"--set 'optimizer.lr=1'", "did you mean 'train.lr'?"});
}

TEST(ConfigErrors, WrongTypeSaysExpectedAndGot) {
  expect_error(load_error(with("train", "lr", "abc")), {"train.lr", "expected a number", "got string \"abc\""});
  expect_error(load_error(with("train", "steps", 1.5)), {"train.steps", "expected an integer", "got number 1.5"});
  expect_error(load_error(with("train", "micro_batch", "8")), {"train.micro_batch", "expected an integer", "string"});
  expect_error(load_error(with("data", "shuffle", 1)), {"data.shuffle", "expected a boolean", "got number"});
  expect_error(load_error(with("data", "train", 5)), {"data.train", "expected a string", "got number"});
  expect_error(load_error(with("model", "preset", nullptr)), {"model.preset", "expected a string", "got null"});
  expect_error(load_error(with("train", "steps", 1e12)), {"train.steps", "out of range"});
  expect_error(load_error(base_config(), {"train.steps=ten"}), {"--set 'train.steps=ten'", "train.steps",
                                                                "expected an integer", "got string"});
  json j = base_config();
  j["train"] = 5;
  expect_error(load_error(j), {"section 'train' must be a JSON object", "got number"});
  expect_error(load_error(json::array()), {"top level must be a JSON object"});
  expect_error(load_error(j, {"train.lr=1e-3"}), {"--set 'train.lr=1e-3'", "section 'train'", "JSON object"});
}

TEST(ConfigErrors, OutOfRange) {
  struct Case {
    const char* section;
    const char* key;
    json value;
    const char* expect;
  };
  const Case cases[] = {
      {"train", "micro_batch", 0, "train.micro_batch must be in [1, 65536] (got 0)"},
      {"train", "seq_len", -4, "train.seq_len must be in [1, 1048576]"},
      {"train", "steps", 0, "train.steps must be in [1, 1000000000]"},
      {"train", "lr", 0.0, "train.lr must be > 0"},
      {"train", "lr", -1e-3, "train.lr must be > 0"},
      {"train", "warmup_steps", -1, "train.warmup_steps must be in [0, 1000000000]"},
      {"train", "global_batch_tokens", -1024, "train.global_batch_tokens must be in [0, 1099511627776]"},
      {"train", "final_lr_frac", 1.5, "train.final_lr_frac must be in [0, 1]"},
      {"train", "wsd_decay_frac", -0.1, "train.wsd_decay_frac must be in [0, 1]"},
      {"train", "grad_clip", -1.0, "train.grad_clip must be >= 0"},
      {"train", "recompute", 2, "train.recompute must be in [0, 1]"},
      {"train", "schedule", "cosin", "train.schedule must be one of cosine, linear, constant, wsd (got 'cosin')"},
      {"optimizer", "beta1", 1.0, "optimizer.beta1 must be in (0, 1)"},
      {"optimizer", "beta1", 0.0, "optimizer.beta1 must be in (0, 1)"},
      {"optimizer", "beta2", 1.5, "optimizer.beta2 must be in (0, 1)"},
      {"optimizer", "eps", 0.0, "optimizer.eps must be > 0"},
      {"optimizer", "weight_decay", -0.1, "optimizer.weight_decay must be >= 0"},
      {"optimizer", "type", "sgd", "optimizer.type must be one of adamw"},
      {"sample", "temperature", 0.0, "sample.temperature must be > 0"},
      {"sample", "top_k", -1, "sample.top_k must be in [0, 16777216]"},
      {"sample", "tokens", -1, "sample.tokens must be in [0, 1000000]"},
      {"eval", "batches", 0, "eval.batches must be in [1, 1000000]"},
      {"eval", "every", -1, "eval.every must be in [0, 1000000000]"},
      {"log", "every", 0, "log.every must be in [1, 1000000000]"},
      {"parallel", "init", "slurm", "parallel.init must be one of auto, mpi, tcp, fs, none"},
      {"parallel", "zero_stage", 2, "parallel.zero_stage must be in [0, 1]"},
      {"parallel", "timeout_s", 0, "parallel.timeout_s must be >= 1"},
      {"checkpoint", "every", -5, "checkpoint.every must be in [0, 1000000000]"},
      {"checkpoint", "keep", -1, "checkpoint.keep must be in [0, 1000000]"},
      {"model", "n_layer", 0, "model.n_layer must be in [1, 1024]"},
      {"model", "vocab_size", 0, "model.vocab_size must be in [1, 16777216]"},
      {"model", "padded_vocab_multiple", 0, "model.padded_vocab_multiple must be in [1, 65536]"},
      {"model", "norm_eps", 0.0, "model.norm_eps must be > 0"},
      {"model", "n_kv_head", 0, "model.n_kv_head must be in [1, 1024]"},
      {"model", "rope_theta", 0.0, "model.rope_theta must be > 0"},
      {"model", "rope_theta", -1.0, "model.rope_theta must be > 0"},
      {"data", "seed", -1, "data.seed must be >= 0"},
  };
  for (const Case& c : cases) expect_error(load_error(with(c.section, c.key, c.value)), {c.expect});
}

TEST(ConfigErrors, PrecisionCombinations) {
  auto recipe = [](const char* name) { return with("precision", "recipe", name); };
  json j = recipe("fp8_blockwise");
  j["precision"]["fast_accum"] = true;
  expect_error(load_error(j), {"precision.fast_accum", "block scales", "split"});
  j = recipe("fp8_blockwise");
  j["precision"]["scaling"] = "delayed";
  expect_error(load_error(j), {"precision.scaling", "delayed", "block"});
  j = recipe("fp8_tensorwise");
  j["precision"]["w_granularity"] = "128x128";
  expect_error(load_error(j), {"cannot mix per-tensor and block scales"});
  j = recipe("fp8_blockwise");
  j["precision"]["x_granularity"] = "128x128";
  expect_error(load_error(j), {"x and w are both 128x128"});
  j = recipe("fp8_tensorwise");
  j["precision"]["bf16_layers"] = json::array({0, 2});
  expect_error(load_error(j), {"precision.bf16_layers", "layer 2 does not exist", "2 blocks"});
  j = recipe("fp8_tensorwise");
  j["precision"]["bf16_layers"] = json::array({0, "last"});
  expect_error(load_error(j), {"precision.bf16_layers", "expected a list of integers"});
  j = recipe("fp8_tensorwise");
  j["precision"]["x_format"] = "e3m4";
  expect_error(load_error(j), {"precision.x_format must be one of e4m3, e5m2, e2m1", "e3m4"});
  j = recipe("fp8_tensorwise");
  j["precision"]["dy_granularity"] = "1x64";
  expect_error(load_error(j), {"precision.dy_granularity must be one of tensor, 1x128, 128x128, 1x16, 1x32, 16x16"});
  // FP8 GEMMs: B*T and the widths must be multiples of 16 (128 with blocks).
  j = recipe("fp8_blockwise");
  j["train"] = {{"micro_batch", 1}, {"seq_len", 100}};
  expect_error(load_error(j), {"micro_batch * train.seq_len", "multiple of 128"});
  j = recipe("fp8_tensorwise");
  j["model"] = {{"n_embd", 256}, {"n_head", 4}, {"ffn_hidden", 1000}};
  expect_error(load_error(j), {"model.ffn_hidden (1000)", "multiples of 16"});
}

TEST(ConfigErrors, EnumerationsAndNames) {
  expect_error(load_error(with("precision", "recipe", "fp8")),
               {"precision.recipe", "unknown recipe 'fp8'", "known in this build: bf16, fp8_tensorwise"});
  expect_error(load_error(with("model", "preset", "gpt2-xl")),
               {"model.preset", "unknown preset 'gpt2-xl'", "gpt2-tiny", "gpt2-124m", "gpt2-1558m"});
  expect_error(load_error(with("model", "arch", "bert")),
               {"model.arch", "unknown architecture 'bert'", "supported: gpt2, llama"});
  EXPECT_EQ(load_error(with("model", "arch", "llama")), "");
  expect_error(load_error(with("checkpoint", "resume", "")), {"checkpoint.resume", "auto", "none"});
}

TEST(ConfigErrors, BatchMustDivide) {
  json j = with("train", "global_batch_tokens", 1000);
  expect_error(load_error(j), {"train.global_batch_tokens = 1000", "must be a multiple of micro_batch * seq_len * "
                               "world_size = 2 * 64 * 1 = 128"});
  json k = with("train", "global_batch_tokens", 2 * 64 * 4);  // divides for 1, 2 and 4 GPUs but not for 3
  EXPECT_EQ(load_error(k, {}, 2), "");
  expect_error(load_error(k, {}, 3), {"train.global_batch_tokens = 512", "2 * 64 * 3 = 384"});
}

TEST(ConfigErrors, CombinationsOfKeys) {
  expect_error(load_error(with("train", "seq_len", 512)),
               {"train.seq_len = 512 exceeds model.max_seq_len = 256"});
  json j = base_config();
  j["model"]["n_embd"] = 200;
  j["model"]["n_head"] = 3;
  expect_error(load_error(j), {"model.n_embd = 200 is not divisible by model.n_head = 3"});
  j["model"]["n_head"] = 5;  // head size 40
  expect_error(load_error(j), {"model.n_embd / model.n_head", "= 40 is not a supported head size", "64 and 128"});
  j["model"]["n_embd"] = 256;
  j["model"]["n_head"] = 2;  // head size 128 is supported
  EXPECT_EQ(load_error(j), "");
  j["model"]["n_head"] = 4;
  j["model"]["n_kv_head"] = 3;
  expect_error(load_error(j), {"model.n_head = 4 is not divisible by model.n_kv_head = 3"});
  j["model"]["n_kv_head"] = 2;
  expect_error(load_error(j), {"model.n_kv_head = 2", "gpt2", "must equal model.n_head = 4"});
  j["model"]["arch"] = "llama";  // grouped-query attention is llama's
  EXPECT_EQ(load_error(j), "");
  j["model"]["ffn_hidden"] = 1000;
  EXPECT_EQ(load_error(j), "");
  j["model"]["ffn_hidden"] = 1001;
  expect_error(load_error(j), {"model.ffn_hidden = 1001 must be a multiple of 8 for llama"});
  j["model"]["ffn_hidden"] = 1024;
  j["model"]["n_kv_head"] = 3;
  expect_error(load_error(j), {"model.n_head = 4 is not divisible by model.n_kv_head = 3"});
  j["model"]["n_kv_head"] = 1;
  j["model"]["n_head"] = 8;  // head size 32
  expect_error(load_error(j), {"= 32 is not a supported head size"});
  expect_error(load_error(with("model", "tied_embeddings", false)),
               {"model.tied_embeddings = false", "gpt2 always ties"});
  json w = with("train", "warmup_steps", 11);
  expect_error(load_error(w), {"train.warmup_steps = 11 exceeds train.steps = 10"});
  expect_error(load_error(with("data", "train", "")), {"data.train is empty"});
  json e = with("eval", "every", 5);
  e["data"]["val"] = "";
  expect_error(load_error(e), {"eval.every = 5", "data.val is empty"});
  expect_error(load_error(with("sample", "top_k", 60000)), {"sample.top_k = 60000 exceeds model.vocab_size"});
  expect_error(load_error(with("parallel", "init", "fs")), {"parallel.init", "parallel.fs_path is empty"});
  expect_error(load_error(base_config(), {}, 0), {"world size must be >= 1"});
}

TEST(ConfigErrors, BadSetSyntax) {
  expect_error(load_error(base_config(), {"train.lr"}), {"--set 'train.lr'", "expected section.key=value"});
  expect_error(load_error(base_config(), {"lr=3e-4"}), {"--set 'lr=3e-4'", "must be section.key", "train.lr"});
  expect_error(load_error(base_config(), {".lr=3e-4"}), {"--set '.lr=3e-4'", "must be section.key"});
  expect_error(load_error(base_config(), {"train.=3"}), {"--set 'train.=3'", "must be section.key"});
  expect_error(load_error(base_config(), {"trainn.lr=3e-4"}), {"--set 'trainn.lr=3e-4'", "unknown section 'trainn'",
                                                               "did you mean 'train'"});
  expect_error(load_error(base_config(), {"train.lrr=3e-4"}), {"--set 'train.lrr=3e-4'", "did you mean 'train.lr'"});
}

TEST(ConfigErrors, FilesNameThemselves) {
  std::string missing = testing::TempDir() + "llm8_no_such_config.json";
  try {
    llmc::load_config(missing, {});
    FAIL() << "a missing file loaded";
  } catch (const llmc::Error& e) {
    expect_error(e.what(), {"cannot open config file", missing});
  }
  std::string bad = testing::TempDir() + "llm8_bad_config.json";
  std::ofstream(bad) << "{\n  \"train\": {\"lr\": 1e-3,}\n}\n";
  try {
    llmc::load_config(bad, {});
    FAIL() << "malformed JSON loaded";
  } catch (const llmc::Error& e) {
    expect_error(e.what(), {bad, "invalid JSON", "line 2"});
  }
  std::string unknown = testing::TempDir() + "llm8_unknown_key.json";
  std::ofstream(unknown) << R"({"data": {"train": "a_*.bin"}, "train": {"lrr": 1}})";
  try {
    llmc::load_config(unknown, {});
    FAIL() << "an unknown key loaded";
  } catch (const llmc::Error& e) {
    expect_error(e.what(), {unknown + ": unknown key 'train.lrr'", "did you mean 'train.lr'"});
  }
  std::string invalid = testing::TempDir() + "llm8_invalid.json";
  std::ofstream(invalid) << R"({"data": {"train": "a_*.bin"}, "train": {"seq_len": 4096}})";
  try {
    llmc::load_config(invalid, {});
    FAIL() << "an invalid config loaded";
  } catch (const llmc::Error& e) {
    expect_error(e.what(), {invalid + ": train.seq_len = 4096 exceeds model.max_seq_len = 1024"});
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Hostile input: deep nesting, duplicate keys, numbers that do not fit, size bounds and derived sizes, non-regular
// files. Where the old failure was a crash, a hang or a blow-up, the check runs in a child process with a time and an
// address-space limit (test/support/bounded_run.h).

namespace {

// A config file written as is.
std::string write_config(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// `depth` nested arrays around 1, as text ("[[[1]]]").
std::string nested_arrays(size_t depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

// The same as a JSON value, built without recursion (nlohmann destroys values iteratively).
json nested_value(size_t depth) {
  json root = json::array();
  json* inner = &root;
  for (size_t i = 1; i < depth; i++) {
    inner->push_back(json::array());
    inner = &inner->back();
  }
  return root;
}

}  // namespace

class ConfigHostile : public llmc_test::TempDirTest {};

TEST_F(ConfigHostile, DeepNestingIsRefusedInEveryEntryPoint) {
  // A 200 KB config of nested arrays used to overflow the stack (the copy in load_config recurses).
  const std::string deep = write_config(dir_, "deep.json", "{\"model\": {\"n_layer\": " + nested_arrays(100000) + "}}");
  llmc_test::expect_bounded_error([&] { llmc::load_config(deep, {}); },
                                  {deep, "JSON nested deeper than 64 levels", "at 'model.n_layer[0]"});
  // The same nesting under an unknown key, and as a whole document of objects.
  std::string objects;
  for (int i = 0; i < 50000; i++) objects += "{\"a\":";
  objects += "1" + std::string(50000, '}');
  const std::string deep_objects = write_config(dir_, "objects.json", objects);
  llmc_test::expect_bounded_error([&] { llmc::load_config(deep_objects, {}); },
                                  {deep_objects, "nested deeper than 64 levels"});
  // In a --set value.
  llmc_test::expect_bounded_error(
      [&] { llmc::load_config_json(base_config(), {"precision.bf16_layers=" + nested_arrays(100000)}); },
      {"--set 'precision.bf16_layers=[[[", "nested deeper than 64 levels"});
  // A document built in code (e.g. a checkpoint's config) is checked before it is copied.
  llmc_test::expect_bounded_error(
      [&] {
        json j = base_config();
        j["model"]["n_layer"] = nested_value(100000);
        llmc::load_config_json(j, {});
      },
      {"config: JSON nested deeper than 64 levels"});
  // The lenient reader of the parallel section keeps its defaults.
  const llmc_test::BoundedResult r = llmc_test::run_bounded([&] {
    const llmc::ParallelConfig p = llmc::bootstrap_parallel_config(deep, {"parallel.timeout_s=" + nested_arrays(100000)});
    if (p.timeout_s != llmc::ParallelConfig().timeout_s) throw llmc::Error("defaults changed");
  });
  EXPECT_EQ(r.end, llmc_test::BoundedResult::End::Returned) << r.describe();
  // Within the limit it is only a wrong type.
  expect_error(load_error(base_config(), {"precision.bf16_layers=" + nested_arrays(60)}),
               {"precision.bf16_layers: expected a list of integers"});
}

TEST_F(ConfigHostile, DuplicateKeysAreRefusedNamingTheKeyAndLine) {
  const std::string in_section = write_config(dir_, "dup_key.json", R"({
  "model": {"preset": "gpt2-tiny"},
  "data": {"train": "a_*.bin"},
  "train": {
    "lr": 1e-3,
    "steps": 10,
    "lr": 3e-4
  }
})");
  expect_error(error_of([&] { llmc::load_config(in_section, {}); }),
               {in_section + ": duplicate key 'train.lr' (line 7)"});
  const std::string section = write_config(dir_, "dup_section.json",
                                           "{\"train\": {\"lr\": 1e-3},\n\"data\": {},\n\"train\": {\"steps\": 5}}\n");
  expect_error(error_of([&] { llmc::load_config(section, {}); }), {section + ": duplicate key 'train' (line 3)"});
  const std::string nested = write_config(dir_, "dup_nested.json",
                                          "{\"model\": {\"x\": [0, {\"a\": 1,\n \"a\": 2}]}}");
  expect_error(error_of([&] { llmc::load_config(nested, {}); }), {"duplicate key 'model.x[1].a' (line 2)"});
  // Comments do not hide a duplicate.
  const std::string commented = write_config(dir_, "dup_comment.json",
                                             "{\"data\": {\"train\": \"a\", // first\n /* second */ \"train\": \"b\"}}");
  expect_error(error_of([&] { llmc::load_config(commented, {}); }), {"duplicate key 'data.train' (line 2)"});
  // In a --set value (an object is the wrong type, but the duplicate is what is wrong first).
  expect_error(load_error(base_config(), {R"(train.lr={"a": 1, "a": 2})"}), {"--set", "duplicate key 'a'"});
}

TEST_F(ConfigHostile, NumbersThatDoNotFitNameTheKey) {
  // In a file: was an "internal error" (nlohmann's out_of_range escaped).
  for (const char* number : {"1e309", "-1e309", "123e4567"}) {
    const std::string path = write_config(dir_, "overflow.json",
                                          std::string("{\"data\": {\"train\": \"a\"},\n\"train\": {\"lr\": ") + number +
                                              "}}");
    expect_error(error_of([&] { llmc::load_config(path, {}); }),
                 {path + ": the number " + number + " of 'train.lr' (line 2) does not fit a 64-bit float"});
    const std::string int_key = write_config(dir_, "overflow_int.json",
                                             std::string("{\"train\": {\"steps\": ") + number + "}}");
    expect_error(error_of([&] { llmc::load_config(int_key, {}); }), {"of 'train.steps' does not fit a 64-bit float"});
  }
  // In --set, for float and int keys.
  expect_error(load_error(base_config(), {"train.lr=1e309"}),
               {"--set 'train.lr=1e309': the number 1e309 does not fit a 64-bit float"});
  expect_error(load_error(base_config(), {"train.steps=-1e309"}),
               {"--set 'train.steps=-1e309': the number -1e309 does not fit a 64-bit float"});
  // NaN-like words are not JSON numbers: the type error names the key.
  for (const char* word : {"nan", "NaN", "inf", "-inf", "Infinity"}) {
    expect_error(load_error(base_config(), {std::string("train.lr=") + word}), {"train.lr: expected a number, got string"});
    expect_error(load_error(base_config(), {std::string("train.steps=") + word}),
                 {"train.steps: expected an integer, got string"});
  }
  // Non-finite values in a document built in code.
  expect_error(load_error(with("train", "lr", std::nan(""))), {"train.lr:", "not a finite number"});
  expect_error(load_error(with("train", "lr", INFINITY)), {"train.lr:", "not a finite number"});
  expect_error(load_error(with("train", "steps", -INFINITY)), {"train.steps: expected an integer, got number -inf"});
  // Integers past the key's type.
  expect_error(load_error(with("train", "steps", 1e10)), {"train.steps: 10000000000.0 is out of range for an integer"});
  expect_error(load_error(with("train", "steps", 18446744073709551615ull)), {"train.steps:", "out of range"});
  expect_error(load_error(with("train", "global_batch_tokens", 18446744073709551615ull)),
               {"train.global_batch_tokens:", "out of range"});
  expect_error(load_error(with("precision", "bf16_layers", json::array({0, 4294967296ll}))),
               {"precision.bf16_layers: 4294967296 is out of range for an integer"});
}

TEST(ConfigHostileFloats, Float32KeysRefuseOverflowAndUnderflow) {
  // model.norm_eps and model.rope_theta are 32-bit floats: 1e39 became inf, passed "> 0" and printed as null.
  expect_error(load_error(with("model", "norm_eps", 1e39)),
               {"model.norm_eps = 1e+39 does not fit the key's 32-bit float"});
  expect_error(load_error(with("model", "rope_theta", -1e300)),
               {"model.rope_theta = -1e+300 does not fit the key's 32-bit float"});
  expect_error(load_error(with("model", "norm_eps", 1e-50)), {"model.norm_eps = 1e-50 is too small", "it would be 0"});
  // The largest values that fit round-trip through --print-config's JSON.
  json j = with("model", "rope_theta", 3.4e38);
  j["model"]["norm_eps"] = 1e-45;  // rounds to the smallest subnormal float
  const RunConfig cfg = llmc::load_config_json(j, {});
  const json printed = llmc::config_to_json(cfg);
  EXPECT_TRUE(std::isfinite(printed["model"]["rope_theta"].get<double>()));
  EXPECT_EQ(llmc::config_to_json(llmc::load_config_json(json::parse(printed.dump()), {})), printed);
}

TEST(ConfigHostileSizes, EverySizeKeyHasAnUpperBound) {
  struct Bound {
    const char* section;
    const char* key;
    long long max;
  };
  const Bound bounds[] = {
      {"model", "n_layer", 1024},          {"model", "n_head", 1024},
      {"model", "n_kv_head", 1024},        {"model", "n_embd", 65536},
      {"model", "vocab_size", 16777216},   {"model", "padded_vocab_multiple", 65536},
      {"model", "max_seq_len", 1048576},   {"model", "ffn_hidden", 262144},
      {"train", "micro_batch", 65536},     {"train", "seq_len", 1048576},
      {"train", "global_batch_tokens", 1099511627776ll},
      {"train", "steps", 1000000000},      {"train", "warmup_steps", 1000000000},
      {"train", "max_skipped_steps", 1000000000},
      {"precision", "amax_history_len", 1000000},
      {"checkpoint", "every", 1000000000}, {"checkpoint", "keep", 1000000},
      {"eval", "every", 1000000000},       {"eval", "batches", 1000000},
      {"sample", "every", 1000000000},     {"sample", "tokens", 1000000},
      {"sample", "top_k", 16777216},       {"log", "every", 1000000000},
      {"log", "numerics_every", 1000000000},
  };
  for (const Bound& b : bounds) {
    const std::string name = std::string(b.section) + "." + b.key;
    expect_error(load_error(with(b.section, b.key, b.max + 1)),
                 {name + " must be in [", ", " + std::to_string(b.max) + "] (got " + std::to_string(b.max + 1) + ")"});
    expect_error(load_error(with(b.section, b.key, 2147483647)), {name});
    // The documentation shows the bound.
    bool documented = false;
    for (const auto& d : llmc::config_key_docs())
      if (d.key == name) documented = d.help.find(", " + std::to_string(b.max) + "]") != std::string::npos;
    EXPECT_TRUE(documented) << name;
  }
  // global_batch_tokens near 2^63 was "valid" (its accumulation count wrapped in 32 bits).
  expect_error(load_error(with("train", "global_batch_tokens", 4611686018427387904ll)),
               {"train.global_batch_tokens must be in [0, 1099511627776]"});
  expect_error(load_error(with("train", "global_batch_tokens", 9223372036854775807ll)),
               {"train.global_batch_tokens:", "out of range"});
}

TEST(ConfigHostileSizes, DerivedSizesAreCheckedAndNameTheKeys) {
  // B * T per GPU.
  json j = with("train", "micro_batch", 65536);
  j["train"]["seq_len"] = 256;  // 2^24 tokens: the largest micro-batch
  EXPECT_EQ(load_error(j), "");
  j["train"]["seq_len"] = 257;
  j["model"]["max_seq_len"] = 1024;
  expect_error(load_error(j), {"train.micro_batch * train.seq_len = 65536 * 257 = 16842752 tokens per GPU "
                               "micro-batch exceeds 16777216"});
  // B * T * world_size (the world size comes from the launcher).
  json w = with("train", "micro_batch", 65536);
  w["train"]["seq_len"] = 128;  // 2^23 tokens per GPU
  expect_error(load_error(w, {}, 1 << 18), {"train.micro_batch * train.seq_len * world_size = 65536 * 128 * 262144",
                                            "exceeds 1099511627776"});
  // Accumulation micro-steps per optimizer step.
  json a = with("train", "global_batch_tokens", 1099511627776ll);
  a["train"]["micro_batch"] = 1;
  expect_error(load_error(a), {"= 1099511627776 / 64 = 17179869184 accumulation micro-steps", "more than 16777216"});
  a["train"]["micro_batch"] = 16384;  // 2^20 tokens per micro-step: 2^20 micro-steps is within the bound
  a["model"]["max_seq_len"] = 64;
  EXPECT_EQ(llmc::load_config_json(a, {}).grad_accum_steps, 1048576);
  // The derived FFN width: n_embd past its bound is reported as n_embd (4 * n_embd used to wrap into a negative
  // model.ffn_hidden error).
  for (const char* arch : {"gpt2", "llama"}) {
    json f = base_config();
    f["model"] = {{"arch", arch}, {"n_embd", 600000000}, {"n_head", 2}};
    expect_error(load_error(f), {"model.n_embd must be in [1, 65536] (got 600000000)"});
    EXPECT_EQ(load_error(f).find("ffn_hidden"), std::string::npos) << load_error(f);
  }
  // The padded vocabulary at its extremes, exactly.
  json v = with("model", "vocab_size", 16777215);
  v["model"]["padded_vocab_multiple"] = 65535;
  EXPECT_EQ(llmc::load_config_json(v, {}).model.padded_vocab_size, 256 * 65535 + 65535);
  v["model"]["padded_vocab_multiple"] = 65536;
  EXPECT_EQ(llmc::load_config_json(v, {}).model.padded_vocab_size, 16777216);
  expect_error(load_error(with("model", "vocab_size", 2147483647)), {"model.vocab_size must be in [1, 16777216]"});
}

// The largest model and batch every bound allows: loads, and the dry run's parameter count and memory estimate are
// exact (no 64-bit wrap: each is compared with 128-bit arithmetic), within a second and without a big allocation.
TEST(ConfigHostileSizes, TheLargestConfigHasExactDerivedSizes) {
  for (const char* arch : {"gpt2", "llama"}) {
    json j = base_config();
    j["model"] = {{"arch", arch},        {"n_layer", 1024},        {"n_head", 1024},        {"n_embd", 65536},
                  {"vocab_size", 16777215}, {"padded_vocab_multiple", 65536}, {"max_seq_len", 1048576},
                  {"ffn_hidden", 262144}, {"tied_embeddings", std::string(arch) == "gpt2"}};
    j["train"] = {{"micro_batch", 16}, {"seq_len", 1048576}, {"global_batch_tokens", 1099511627776ll},
                  {"steps", 1000000000}};
    const RunConfig cfg = llmc::load_config_json(j, {});
    EXPECT_EQ(cfg.grad_accum_steps, 65536);
    const llmc::ModelSpec& m = cfg.model;
    const llmc::ParamTable table = llmc::build_param_table(m);
    unsigned __int128 elements = 0;
    for (const llmc::ParamInfo& p : table.params) {
      unsigned __int128 numel = 1;
      for (int64_t d : p.shape) numel *= static_cast<unsigned __int128>(d);
      elements += numel;
    }
    EXPECT_TRUE(elements == table.num_parameters) << arch;
    EXPECT_EQ(llmc::count_parameters(m, true), table.num_parameters);
    // The memory plan's rows add up without a wrap (in 128 bits), and its logits row holds at least the B*T*Vp
    // BF16 logits.
    const llmc::MemoryPlan plan = llmc::plan_memory(cfg, 1);
    unsigned __int128 total = 0;
    for (const llmc::MemoryPlan::Row& r : plan.rows) total += r.bytes;
    EXPECT_TRUE(total == plan.total()) << arch;
    EXPECT_TRUE(static_cast<unsigned __int128>(plan.bytes("logits and losses")) >=
                static_cast<unsigned __int128>(16ull * 1048576ull) * m.padded_vocab_size * 2) << arch;
    // The dry run (which builds the parameter table) stays small and quick.
    const llmc_test::BoundedResult r =
        llmc_test::run_bounded([&] { llmc::dry_run_report(cfg, 1); }, /*seconds=*/5, /*extra_bytes=*/512ull << 20);
    EXPECT_EQ(r.end, llmc_test::BoundedResult::End::Returned) << r.describe();
  }
}

TEST_F(ConfigHostile, OneLineConfigsAllocateNothingBig) {
  // Sizes from a one-line config used to reach the parameter table before any bound (6 GB, 20 s, std::bad_alloc).
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model": {"n_layer": 2147483647}, "data": {"train": "a"}})",
       "model.n_layer must be in [1, 1024] (got 2147483647)"},
      {R"({"model": {"n_embd": 2147483584, "n_head": 33554431}, "data": {"train": "a"}})",
       "model.n_embd must be in [1, 65536] (got 2147483584)"},
      {R"({"model": {"vocab_size": 2147483647}, "data": {"train": "a"}})",
       "model.vocab_size must be in [1, 16777216] (got 2147483647)"},
      {R"({"model": {"max_seq_len": 2147483647}, "train": {"seq_len": 2147483647}, "data": {"train": "a"}})",
       "model.max_seq_len must be in [1, 1048576] (got 2147483647)"},
      {R"({"train": {"micro_batch": 2147483647}, "data": {"train": "a"}})",
       "train.micro_batch must be in [1, 65536] (got 2147483647)"},
  };
  for (const auto& [text, expect] : cases) {
    const std::string huge = write_config(dir_, "huge.json", text);
    llmc_test::expect_bounded_error(
        [&] {
          const RunConfig cfg = llmc::load_config(huge, {});
          llmc::dry_run_report(cfg, 1);
        },
        {huge, expect}, /*seconds=*/2, /*extra_bytes=*/256ull << 20);
  }
}

TEST_F(ConfigHostile, NonRegularConfigFilesAreRefused) {
  const std::string fifo = path("config.fifo");
  llmc_test::make_fifo(fifo);
  llmc_test::expect_bounded_error([&] { llmc::load_config(fifo, {}); },
                                  {"config file '" + fifo + "' is a FIFO (named pipe), not a regular file"});
  llmc_test::expect_bounded_error([&] { llmc::load_config(dir_, {}); },
                                  {"config file '" + dir_ + "' is a directory, not a regular file"});
  llmc_test::expect_bounded_error([&] { llmc::load_config("/dev/zero", {}); },
                                  {"'/dev/zero' is a character device, not a regular file"});
  const llmc_test::BoundedResult r = llmc_test::run_bounded([&] { llmc::bootstrap_parallel_config(fifo, {}); });
  EXPECT_EQ(r.end, llmc_test::BoundedResult::End::Returned) << r.describe();
}

// ---------------------------------------------------------------------------------------------------------------
// The shipped configs and their documentation

TEST(ConfigFiles, EveryShippedConfigValidates) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kSourceDir + "/configs")) {
    if (entry.path().extension() != ".json") continue;
    count++;
    EXPECT_NO_THROW(llmc::load_config(entry.path().string(), {})) << entry.path();
  }
  EXPECT_GE(count, 6);
}

TEST(ConfigFiles, QuickStartAndLargeConfigs) {
  RunConfig mini = llmc::load_config(kSourceDir + "/configs/gpt2_mini_bf16.json", {});
  EXPECT_EQ(mini.model_preset, "gpt2-mini");
  EXPECT_EQ(mini.train.micro_batch, 16);
  EXPECT_EQ(mini.train.seq_len, 512);
  EXPECT_EQ(mini.train.steps, 600);
  EXPECT_EQ(mini.checkpoint.dir, "runs/gpt2_mini_bf16");
  RunConfig big = llmc::load_config(kSourceDir + "/configs/gpt2_124m_bf16.json", {}, 8);
  EXPECT_EQ(big.train.global_batch_tokens, 524288);
  EXPECT_EQ(big.grad_accum_steps, 524288 / (big.train.micro_batch * 1024 * 8));
  EXPECT_DOUBLE_EQ(big.train.lr, 6e-4);
}

TEST(ConfigFiles, ReadmeDocumentsEveryKey) {
  std::string readme = read_text(kSourceDir + "/configs/README.md");
  ASSERT_FALSE(readme.empty()) << "configs/README.md is missing";
  for (const auto& doc : llmc::config_key_docs())
    EXPECT_NE(readme.find("`" + doc.key + "`"), std::string::npos) << doc.key << " is not in configs/README.md";
  for (const std::string& preset : llmc::model_preset_names())
    EXPECT_NE(readme.find(preset), std::string::npos) << preset;
}
