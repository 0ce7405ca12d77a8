// test/model/test_model_golden: what every model family produces, pinned by digests recorded before the model
// families became registered descriptors, so that moving that knowledge changes nothing: for every preset the
// parameter table (names, shapes, offsets, roles, layers, weight decay, initialisation constants), the parameter
// counts, FLOPs per token and the memory plan; the resolved config and the --dry-run report of every preset and of
// configs whose derived keys follow the architecture; the validation messages of configs each family refuses; Hugging
// Face and llm.c exports and imports (config.json, tensor bytes, the spec read back). Every input is exact on any
// machine (no values from libm), so the digests are the same everywhere.
//
// A digest is FNV-1a 64 over a canonical text of the facet. LLM8_PRINT_GOLDEN=1 prints the table of digests this build
// computes, to paste below when a change is meant to alter one (and the commit says why).
#include <gtest/gtest.h>

#include "test/support/temp_dir.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/io/interop.h"
#include "llmc/model/model.h"
#include "llmc/model/model_spec.h"
#include "llmc/run/cli.h"
#include "llmc/run/config.h"

using namespace llmc;
using nlohmann::json;

namespace {

class Digest {
 public:
  Digest& bytes(const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; i++) {
      h_ ^= p[i];
      h_ *= 1099511628211ull;
    }
    return *this;
  }
  Digest& text(const std::string& s) { return bytes(s.data(), s.size()).bytes("\n", 1); }
  template <typename T>
  Digest& value(const T& v) {
    return bytes(&v, sizeof v);
  }
  std::string hex() const { return strformat("%016llx", static_cast<unsigned long long>(h_)); }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ModelSpec preset_spec(const std::string& name) {
  ModelSpec s;
  EXPECT_TRUE(model_preset(name, &s)) << name;
  return s;
}

std::string table_digest(const ModelSpec& spec) {
  const ParamTable t = build_param_table(spec);
  Digest d;
  d.value(t.total_elements).value(t.num_parameters).value(t.vocab_size);
  for (const ParamInfo& p : t.params) {
    d.text(p.name).value(p.offset).value(p.numel).value(p.layer).value(static_cast<int>(p.role));
    d.value(p.weight_decay).value(p.init_std).value(p.init_value);
    for (int64_t x : p.shape) d.value(x);
  }
  return d.hex();
}

std::string sizes_digest(const ModelSpec& spec) {
  Digest d;
  d.value(count_parameters(spec, true)).value(count_parameters(spec, false));
  for (int T : {64, 256, spec.max_seq_len}) d.value(flops_per_token(spec, T));
  for (int recompute : {0, 1}) {
    const ModelMemory m = plan_model_memory(spec, 4, 256, recompute, PrecisionRecipe());
    d.value(m.weights).value(m.gradients).value(m.activations).value(m.precision.total());
  }
  return d.hex();
}

json run_config(const json& model) {
  return json{{"model", model}, {"data", {{"train", "data/x_train_*.bin"}}}, {"train", {{"seq_len", 128}}}};
}

// The resolved config and the dry-run report, or the error message.
std::string config_digest(const json& j) {
  Digest d;
  try {
    const RunConfig cfg = load_config_json(j, {});
    d.text(config_to_json(cfg).dump()).text(dry_run_report(cfg, 1)).text(dry_run_report(cfg, 8));
  } catch (const Error& e) {
    d.text(std::string("error: ") + e.what());
  }
  return d.hex();
}

// Weights whose every value is exact on any machine (no libm): a hash of the element's offset scaled into [-1, 1],
// zero in the alignment gaps and the padded vocabulary rows.
std::vector<float> synthetic_weights(const ParamTable& t) {
  std::vector<float> v(t.total_elements, 0.0f);
  for (const ParamInfo& p : t.params) {
    size_t n = p.numel;
    if (p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead)
      n = static_cast<size_t>(t.vocab_size) * static_cast<size_t>(p.shape[1]);
    for (size_t i = 0; i < n; i++)
      v[p.offset + i] = static_cast<float>(((p.offset + i) * 2654435761ull) % 2001) / 1000.0f - 1.0f;
  }
  return v;
}

// The spec and values of an import.
std::string imported_digest(const ModelWeights& w) {
  const ModelSpec& s = w.spec;
  Digest d;
  d.text(s.arch).value(s.n_layer).value(s.n_head).value(s.n_kv_head).value(s.n_embd).value(s.vocab_size);
  d.value(s.padded_vocab_size).value(s.max_seq_len).value(s.ffn_hidden).value(s.tied_embeddings).value(s.norm_eps);
  d.value(s.rope_theta);
  return d.bytes(w.values.data(), w.values.size() * sizeof(float)).hex();
}

// Small specs of both families that cover the export paths (head sizes 64 and 128, GQA, tied and untied, another
// vocabulary).
std::vector<std::pair<std::string, ModelSpec>> export_specs() {
  std::vector<std::pair<std::string, ModelSpec>> specs;
  specs.emplace_back("gpt2-tiny", preset_spec("gpt2-tiny"));
  ModelSpec g = preset_spec("gpt2-tiny");
  g.vocab_size = 1000;
  g.padded_vocab_size = 1024;
  g.n_embd = 256;
  g.n_head = 2;
  g.n_kv_head = 2;
  g.ffn_hidden = 1024;
  g.norm_eps = 1e-6f;
  specs.emplace_back("gpt2-v1000-hs128", g);
  specs.emplace_back("llama-tiny", preset_spec("llama-tiny"));
  ModelSpec l = preset_spec("llama-tiny");
  l.vocab_size = 1000;
  l.padded_vocab_size = 1024;
  l.tied_embeddings = true;
  l.n_embd = 256;
  l.n_head = 2;
  l.n_kv_head = 2;
  l.ffn_hidden = 768;
  l.rope_theta = 500000.0f;
  specs.emplace_back("llama-v1000-tied-hs128", l);
  return specs;
}

// Every digest this build computes, by facet name.
std::map<std::string, std::string> compute(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const std::string& name : model_preset_names()) {
    const ModelSpec s = preset_spec(name);
    out["table " + name] = table_digest(s);
    out["sizes " + name] = sizes_digest(s);
    out["config " + name] = config_digest(run_config({{"preset", name}}));
  }
  // Configs whose derived keys follow the architecture, and configs each family refuses.
  const std::vector<std::pair<std::string, json>> configs = {
      {"defaults", json::object()},
      {"arch llama", {{"arch", "llama"}}},
      {"arch llama n_embd 1024", {{"arch", "llama"}, {"n_embd", 1024}, {"n_head", 16}}},
      {"llama-1b n_embd 1024", {{"preset", "llama-1b"}, {"n_embd", 1024}}},
      {"llama-1b arch gpt2", {{"preset", "llama-1b"}, {"arch", "gpt2"}}},
      {"gpt2-tiny arch llama", {{"preset", "gpt2-tiny"}, {"arch", "llama"}}},
      {"gpt2-tiny n_head 1", {{"preset", "gpt2-tiny"}, {"n_head", 1}, {"n_embd", 64}}},
      {"unknown arch", {{"arch", "bert"}}},
      {"gpt2 gqa", {{"preset", "gpt2-tiny"}, {"n_kv_head", 1}}},
      {"gpt2 untied", {{"preset", "gpt2-tiny"}, {"tied_embeddings", false}}},
      {"llama ffn 100", {{"preset", "llama-tiny"}, {"ffn_hidden", 100}}},
      {"llama kv 3", {{"preset", "llama-tiny"}, {"n_kv_head", 3}}},
      {"llama untied theta", {{"preset", "llama-125m"}, {"tied_embeddings", false}, {"rope_theta", 10000.0}}},
  };
  for (const auto& [name, model] : configs) out["config " + name] = config_digest(run_config(model));
  // Exports: the bytes of every file written.
  for (const auto& [name, spec] : export_specs()) {
    const std::vector<float> v = synthetic_weights(build_param_table(spec));
    for (WeightDtype dtype : {WeightDtype::F32, WeightDtype::BF16}) {
      const std::string hf = dir + "/hf_" + name + "_" + weight_dtype_name(dtype);
      Digest d;
      for (const std::string& path : export_hf(hf, spec, v.data(), dtype)) d.text(file_bytes(path));
      out[std::string("hf ") + name + " " + weight_dtype_name(dtype)] = d.hex();
      out[std::string("hf import ") + name + " " + weight_dtype_name(dtype)] = imported_digest(import_hf(hf));
      const std::string bin = dir + "/llmc_" + name + "_" + weight_dtype_name(dtype) + ".bin";
      Digest l;
      try {
        export_llmc(bin, spec, v.data(), dtype);
        l.text(file_bytes(bin));
        out[std::string("llmc import ") + name + " " + weight_dtype_name(dtype)] = imported_digest(import_llmc(bin));
      } catch (const Error& e) {
        std::string message = e.what();  // without the temporary directory's name
        for (size_t at; (at = message.find(dir)) != std::string::npos;) message.replace(at, dir.size(), "<dir>");
        l.text("error: " + message);
      }
      out[std::string("llmc ") + name + " " + weight_dtype_name(dtype)] = l.hex();
    }
  }
  return out;
}

// Recorded before the model families became registered descriptors (LLM8_PRINT_GOLDEN=1 prints this table); the
// "config" rows again for each key added to the schema since (the resolved config and the dry run list every key).
const std::map<std::string, std::string> kGolden = {
    {"config arch llama", "f1160e72fb71e022"},
    {"config arch llama n_embd 1024", "75a4f05c9fdffdcd"},
    {"config defaults", "1fa1fecb666f5f00"},
    {"config gpt2 gqa", "9571348db6b63df2"},
    {"config gpt2 untied", "a0a49c269825071e"},
    {"config gpt2-124m", "6890aec4f218e37c"},
    {"config gpt2-1558m", "74d0fb5c8394c76c"},
    {"config gpt2-350m", "4c6324af9218acf8"},
    {"config gpt2-774m", "4afcd9945b1d1891"},
    {"config gpt2-mini", "6cd8386209448a99"},
    {"config gpt2-tiny", "0721598557b4ec6e"},
    {"config gpt2-tiny arch llama", "de225d8b980a2c97"},
    {"config gpt2-tiny n_head 1", "4eb04a0349a36d84"},
    {"config llama ffn 100", "56fb1ad0924f2984"},
    {"config llama kv 3", "c575ad8f51070ae1"},
    {"config llama untied theta", "feef9862e4154f3f"},
    {"config llama-125m", "588dcd274996909d"},
    {"config llama-1b", "87440ab72a400ac7"},
    {"config llama-1b arch gpt2", "5830f2f6c9f75d38"},
    {"config llama-1b n_embd 1024", "f84eb16f6da91696"},
    {"config llama-350m", "6680edcf72a4994b"},
    {"config llama-3b", "8b2038bec5249019"},
    {"config llama-7b", "a2e39c65eccf704a"},
    {"config llama-tiny", "f2e62db4e17adca5"},
    {"config unknown arch", "e4cd6886565ed0fd"},
    {"hf gpt2-tiny bfloat16", "f0f186ecfcc889bc"},
    {"hf gpt2-tiny float32", "61cdc4690769f16d"},
    {"hf gpt2-v1000-hs128 bfloat16", "a449ce01c13cdf12"},
    {"hf gpt2-v1000-hs128 float32", "4c18714ae8657a3a"},
    {"hf import gpt2-tiny bfloat16", "839bc4f3212076a7"},
    {"hf import gpt2-tiny float32", "19872410d9af0d2b"},
    {"hf import gpt2-v1000-hs128 bfloat16", "f795035473b9516f"},
    {"hf import gpt2-v1000-hs128 float32", "a63240703078586b"},
    {"hf import llama-tiny bfloat16", "9d1faf8d0c8c8bd2"},
    {"hf import llama-tiny float32", "3eb827973441c698"},
    {"hf import llama-v1000-tied-hs128 bfloat16", "5abacea23c955c58"},
    {"hf import llama-v1000-tied-hs128 float32", "43ce5cd16067ebc1"},
    {"hf llama-tiny bfloat16", "690f16bd29d33cba"},
    {"hf llama-tiny float32", "b566b34fabb05caa"},
    {"hf llama-v1000-tied-hs128 bfloat16", "5a3d6c19e86488b2"},
    {"hf llama-v1000-tied-hs128 float32", "05842646cc8fdda5"},
    {"llmc gpt2-tiny bfloat16", "f4a3527ae46412c5"},
    {"llmc gpt2-tiny float32", "0e74b25cd3200adf"},
    {"llmc gpt2-v1000-hs128 bfloat16", "1e29ce8db484d2cc"},
    {"llmc gpt2-v1000-hs128 float32", "346cb95ff8c727a6"},
    {"llmc import gpt2-tiny bfloat16", "839bc4f3212076a7"},
    {"llmc import gpt2-tiny float32", "19872410d9af0d2b"},
    {"llmc llama-tiny bfloat16", "324026be7b78a140"},
    {"llmc llama-tiny float32", "593645744fc91d42"},
    {"llmc llama-v1000-tied-hs128 bfloat16", "287f3c617d314313"},
    {"llmc llama-v1000-tied-hs128 float32", "9d45f83f9e8973db"},
    {"sizes gpt2-124m", "040a9557c8cb6827"},
    {"sizes gpt2-1558m", "0666eb8be6747393"},
    {"sizes gpt2-350m", "0dc49644a4c36a6d"},
    {"sizes gpt2-774m", "cd6a1ee0ba6780ee"},
    {"sizes gpt2-mini", "cf5e50dce952e8aa"},
    {"sizes gpt2-tiny", "4d78d8beff95605b"},
    {"sizes llama-125m", "d1e1b95be76ed4bc"},
    {"sizes llama-1b", "8b4c2f2cbcc46f62"},
    {"sizes llama-350m", "2d2e86380b660c99"},
    {"sizes llama-3b", "b7ef6ed01c7b8d0b"},
    {"sizes llama-7b", "7f62c04131c255f7"},
    {"sizes llama-tiny", "84829b3933de4199"},
    {"table gpt2-124m", "f3a0e4898b05390e"},
    {"table gpt2-1558m", "dcef6a915f3c98b6"},
    {"table gpt2-350m", "9802f46238645e66"},
    {"table gpt2-774m", "e5939ae4a3b14c14"},
    {"table gpt2-mini", "591d898b67c3eadd"},
    {"table gpt2-tiny", "092148386bcc0e93"},
    {"table llama-125m", "d7d85611ce234aa1"},
    {"table llama-1b", "7195cbc3fc9d2456"},
    {"table llama-350m", "c9915ee759e055c8"},
    {"table llama-3b", "0f3c76a3f90656f8"},
    {"table llama-7b", "0a2ec9f5596b4c23"},
    {"table llama-tiny", "1cca58f7894f87cc"},
};

class ModelGolden : public llmc_test::TempDirTest {};

TEST_F(ModelGolden, EveryFacetOfEveryFamilyIsUnchanged) {
  const std::map<std::string, std::string> now = compute(dir_);
  if (std::getenv("LLM8_PRINT_GOLDEN")) {
    for (const auto& [name, hex] : now) std::printf("    {\"%s\", \"%s\"},\n", name.c_str(), hex.c_str());
  }
  EXPECT_EQ(now.size(), kGolden.size()) << "facets computed and recorded differ";
  for (const auto& [name, hex] : kGolden) {
    auto it = now.find(name);
    if (it == now.end()) {
      ADD_FAILURE() << "facet '" << name << "' is no longer computed";
      continue;
    }
    EXPECT_EQ(it->second, hex) << "facet '" << name << "' changed";
  }
}

}  // namespace
