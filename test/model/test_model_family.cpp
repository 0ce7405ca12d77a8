// test/model/test_model_family: the model-family registry (llmc/model/family.h) for every registered family: lookups
// and the error for an unknown name; each family's folder and descriptor; every preset through the config's
// validation, the parameter table, the counts, FLOPs and the memory estimate; the Hugging Face config written and read
// back for every preset; the family's tensor mapping and llm.c layout against its table; validation messages that
// name the model.* key. And the rule that makes a family one folder plus one registration: no architecture name is
// compared outside llmc/model/<family>/ (a scan of llmc/, dev/tools/ and train_gpt.cu). Also the model base's named
// views of the flat buffers (ParamViews, carve_blocks), host-side.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/io/interop.h"
#include "llmc/model/family.h"
#include "llmc/model/model.h"
#include "llmc/model/model_spec.h"
#include "llmc/run/config.h"
#include "test/support/error_of.h"

namespace fs = std::filesystem;
using llmc_test::error_of;
using namespace llmc;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

nlohmann::json run_config(const nlohmann::json& model) {
  return {{"model", model}, {"data", {{"train", "data/x_train_*.bin"}}}, {"train", {{"seq_len", 128}}}};
}

}  // namespace

TEST(ModelFamily, RegistryListsTheFamiliesAndFindsThemByName) {
  EXPECT_EQ(model_family_names(), (std::vector<std::string>{"gpt2", "llama"}));
  ASSERT_EQ(model_families().size(), 2u);
  for (const ModelFamily* f : model_families()) {
    EXPECT_EQ(find_model_family(f->name), f);
    EXPECT_EQ(&model_family(f->name), f);
  }
  EXPECT_STREQ(model_family("gpt2").title, "GPT-2");
  EXPECT_STREQ(model_family("llama").title, "Llama");
  EXPECT_EQ(find_model_family("bert"), nullptr);
  EXPECT_EQ(find_model_family("GPT2"), nullptr);  // names are exact
  const std::string msg = error_of([] { model_family("bert"); });
  EXPECT_TRUE(contains(msg, "model.arch") && contains(msg, "unknown architecture 'bert'") &&
              contains(msg, "supported: gpt2, llama"))
      << msg;
  // Every path that needs a family says the same.
  ModelSpec bert;
  bert.arch = "bert";
  EXPECT_TRUE(contains(error_of([&] { build_param_table(bert); }), "unknown architecture 'bert'"));
  EXPECT_TRUE(contains(error_of([&] { load_config_json(run_config({{"arch", "bert"}}), {}); }),
                       "unknown architecture 'bert' (supported: gpt2, llama)"));
}

// A family is one folder and one descriptor file in it; its descriptor is complete.
TEST(ModelFamily, EachFamilyHasItsFolderAndACompleteDescriptor) {
  std::set<std::string> architectures, model_types;
  for (const ModelFamily* f : model_families()) {
    const fs::path folder = fs::path(LLM8_SOURCE_DIR) / "llmc" / "model" / f->name;
    EXPECT_TRUE(fs::exists(folder / (std::string(f->name) + "_family.cpp"))) << folder;
    EXPECT_FALSE(f->presets.empty()) << f->name;
    EXPECT_TRUE(f->build_param_table && f->validate && f->default_ffn_hidden && f->dry_run_details &&
                f->make_model)
        << f->name;
    EXPECT_TRUE(f->hf.architecture && f->hf.model_type && f->hf.write_config && f->hf.read_config &&
                f->hf.is_buffer && f->hf.optional_prefix)
        << f->name;
    EXPECT_TRUE(architectures.insert(f->hf.architecture).second) << f->hf.architecture;
    EXPECT_TRUE(model_types.insert(f->hf.model_type).second) << f->hf.model_type;
    if (f->llmc) EXPECT_TRUE(f->llmc->check && f->llmc->spec_from_header && !f->llmc->tensors.empty()) << f->name;
  }
  EXPECT_NE(model_family("gpt2").llmc, nullptr);  // llm.c's model file holds GPT-2 only
  EXPECT_EQ(model_family("llama").llmc, nullptr);
}

// Every preset of every family: named after its family, found by model_preset, accepted by the config's validation,
// and its table, counts, FLOPs and memory estimate consistent with each other.
TEST(ModelFamily, EveryPresetValidatesAndBuildsItsTable) {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) {
    for (const ModelPreset& p : f->presets) {
      SCOPED_TRACE(p.name);
      names.push_back(p.name);
      EXPECT_EQ(std::string(p.name).rfind(std::string(f->name) + "-", 0), 0u);
      const ModelSpec s = preset_spec(*f, p);
      EXPECT_EQ(s.arch, f->name);
      ModelSpec looked_up;
      ASSERT_TRUE(model_preset(p.name, &looked_up));
      EXPECT_EQ(looked_up.n_layer, s.n_layer);
      EXPECT_EQ(looked_up.ffn_hidden, s.ffn_hidden);
      EXPECT_EQ(s.n_kv_head, p.n_kv_head > 0 ? p.n_kv_head : p.n_head);
      EXPECT_EQ(s.ffn_hidden, p.ffn_hidden > 0 ? p.ffn_hidden : f->default_ffn_hidden(p.n_embd));
      EXPECT_NO_THROW(f->validate(s));
      const RunConfig cfg = load_config_json(run_config({{"preset", p.name}}), {});
      EXPECT_EQ(cfg.model.arch, f->name);
      EXPECT_EQ(cfg.model.ffn_hidden, s.ffn_hidden);
      EXPECT_EQ(cfg.model.padded_vocab_size, s.padded_vocab_size);

      const ParamTable t = build_param_table(s);
      std::set<std::string> tensor_names;
      size_t end = 0;
      for (const ParamInfo& q : t.params) {
        EXPECT_TRUE(tensor_names.insert(q.name).second) << q.name;
        EXPECT_EQ(q.offset % ParamTable::kAlign, 0u) << q.name;
        EXPECT_GE(q.offset, end) << q.name;
        end = q.offset + q.numel;
      }
      EXPECT_EQ(count_parameters(s, true), t.num_parameters);
      EXPECT_LT(count_parameters(s, false), count_parameters(s, true));
      EXPECT_GT(flops_per_token(s, 256), 6.0 * static_cast<double>(s.n_layer) * s.n_embd * 256);
      const ModelMemory m = plan_model_memory(s, 2, 256, 0, PrecisionRecipe());
      EXPECT_LT(plan_model_memory(s, 2, 256, 1, PrecisionRecipe()).activation(ActivationUse::Saved),
                m.activation(ActivationUse::Saved));
      EXPECT_EQ(m.weights, 2 * t.total_elements);
    }
  }
  EXPECT_EQ(model_preset_names(), names);  // registry order
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size()) << "a preset name is reused";
}

// config.json written by the family and read back gives the spec (every preset, and variants of the keys a family
// reads); the common keys frame the family's.
TEST(ModelFamily, HuggingFaceConfigRoundTripsForEveryPreset) {
  auto round_trip = [](const ModelFamily& f, const ModelSpec& s) {
    nlohmann::ordered_json c = nlohmann::ordered_json::object();
    f.hf.write_config(s, &c);
    const nlohmann::json j = nlohmann::json::parse(c.dump());
    const std::string path = "config.json";
    ModelSpec back = f.hf.read_config(HfConfigReader{j, path});
    back.arch = f.name;
    back.padded_vocab_size = s.padded_vocab_size;
    EXPECT_EQ(back.n_layer, s.n_layer);
    EXPECT_EQ(back.n_head, s.n_head);
    EXPECT_EQ(back.n_kv_head, s.n_kv_head);
    EXPECT_EQ(back.n_embd, s.n_embd);
    EXPECT_EQ(back.vocab_size, s.vocab_size);
    EXPECT_EQ(back.max_seq_len, s.max_seq_len);
    EXPECT_EQ(back.ffn_hidden, s.ffn_hidden);
    EXPECT_EQ(back.tied_embeddings, s.tied_embeddings);
    EXPECT_EQ(back.norm_eps, s.norm_eps);
    if (f.uses_rope_theta) EXPECT_EQ(back.rope_theta, s.rope_theta);
    EXPECT_EQ(build_param_table(back).params.size(), build_param_table(s).params.size());
  };
  for (const ModelFamily* f : model_families()) {
    for (const ModelPreset& p : f->presets) {
      SCOPED_TRACE(p.name);
      ModelSpec s = preset_spec(*f, p);
      round_trip(*f, s);
      s.vocab_size = 1000;
      s.norm_eps = 1e-6f;
      s.rope_theta = 123456.0f;
      round_trip(*f, s);
    }
  }
  ModelSpec untied;
  ASSERT_TRUE(model_preset("llama-125m", &untied));
  untied.tied_embeddings = false;
  round_trip(model_family("llama"), untied);
}

// The Hugging Face tensor mapping of each family against its table: GPT-2's Conv1D weights are the transposed ones,
// the vocabulary rows are cut to the real vocabulary, buffers are recognised; llm.c's layout covers the GPT-2 table
// exactly once.
TEST(ModelFamily, TensorMappingsFollowTheTable) {
  ModelSpec g, l;
  ASSERT_TRUE(model_preset("gpt2-tiny", &g));
  ASSERT_TRUE(model_preset("llama-tiny", &l));
  size_t transposed = 0;
  for (const ParamInfo& p : build_param_table(g).params) {
    const HfTensorMapping m = hf_mapping(g, p);
    EXPECT_EQ(m.hf_name, p.name);
    if (m.transposed) {
      transposed++;
      EXPECT_EQ(m.hf_shape, (std::vector<int64_t>{p.shape[1], p.shape[0]})) << p.name;
      EXPECT_TRUE(contains(p.name, ".attn.c_") || contains(p.name, ".mlp.c_")) << p.name;
      EXPECT_EQ(p.shape.size(), 2u) << p.name;
    }
    if (p.role == ParamRole::TokenEmbedding) EXPECT_TRUE(m.vocab_rows && m.hf_shape[0] == g.vocab_size);
  }
  EXPECT_EQ(transposed, 4u * g.n_layer);
  for (const ParamInfo& p : build_param_table(l).params) {
    const HfTensorMapping m = hf_mapping(l, p);
    EXPECT_FALSE(m.transposed) << p.name;
    EXPECT_EQ(m.vocab_rows, p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead) << p.name;
  }
  const ModelFamily& gpt2 = model_family("gpt2");
  const ModelFamily& llama = model_family("llama");
  EXPECT_TRUE(gpt2.hf.is_buffer("h.0.attn.bias") && gpt2.hf.is_buffer("transformer.h.11.attn.masked_bias"));
  EXPECT_FALSE(gpt2.hf.is_buffer("transformer.h.0.attn.c_attn.bias"));
  EXPECT_TRUE(llama.hf.is_buffer("model.layers.0.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(llama.hf.is_buffer("model.layers.0.self_attn.q_proj.weight"));

  std::multiset<std::string> covered;
  const ParamTable t = build_param_table(g);
  for (const LlmcFormat::Tensor& tensor : gpt2.llmc->tensors) {
    const std::string pattern = tensor.table_name;
    const size_t brace = pattern.find("{}");
    for (int layer = 0; layer < (brace == std::string::npos ? 1 : g.n_layer); layer++)
      covered.insert(brace == std::string::npos ? pattern
                                                : pattern.substr(0, brace) + std::to_string(layer) +
                                                      pattern.substr(brace + 2));
  }
  std::multiset<std::string> table_names;
  for (const ParamInfo& p : t.params) table_names.insert(p.name);
  EXPECT_EQ(covered, table_names);
  const ModelSpec header = gpt2.llmc->spec_from_header(g.max_seq_len, g.vocab_size, g.n_layer, g.n_head, g.n_embd,
                                                       g.padded_vocab_size);
  EXPECT_EQ(build_param_table(header).num_parameters, t.num_parameters);
  EXPECT_NO_THROW(gpt2.llmc->check(header, "x.bin"));
}

// What a family refuses is an error that names the model.* key and the fix.
TEST(ModelFamily, ValidationNamesTheKey) {
  ModelSpec g, l;
  ASSERT_TRUE(model_preset("gpt2-tiny", &g));
  ASSERT_TRUE(model_preset("llama-tiny", &l));
  ModelSpec gqa = g;
  gqa.n_kv_head = 1;
  std::string msg = error_of([&] { model_family("gpt2").validate(gqa); });
  EXPECT_TRUE(contains(msg, "model.n_kv_head = 1") && contains(msg, "must equal model.n_head = 2")) << msg;
  ModelSpec untied = g;
  untied.tied_embeddings = false;
  msg = error_of([&] { model_family("gpt2").validate(untied); });
  EXPECT_TRUE(contains(msg, "model.tied_embeddings") && contains(msg, "model.arch llama")) << msg;
  ModelSpec odd = l;
  odd.ffn_hidden = 100;
  msg = error_of([&] { model_family("llama").validate(odd); });
  EXPECT_TRUE(contains(msg, "model.ffn_hidden = 100") && contains(msg, "multiple of 8")) << msg;
  EXPECT_NO_THROW(model_family("llama").validate(l));
  // The --dry-run details: Llama's shape beyond the common line; none for GPT-2.
  EXPECT_EQ(model_family("gpt2").dry_run_details(g), "");
  EXPECT_EQ(model_family("llama").dry_run_details(l), ", 1 kv heads, RoPE theta 10000, untied lm_head");
}

// The views every family carves from the flat buffers: by name, per block, fused weights checked to be contiguous.
TEST(ModelBase, ParamViewsCarveByNameAndCheckFusedWeights) {
  ModelSpec s;
  ASSERT_TRUE(model_preset("llama-tiny", &s));
  const ParamTable t = build_param_table(s);
  std::vector<float> buffer(t.total_elements);
  const ParamViews<float> at(buffer.data(), t);
  EXPECT_EQ(at("model.norm.weight"), buffer.data() + t.get("model.norm.weight").offset);
  struct Block {
    float* norm;
    float* qkv;
  };
  const std::vector<Block> blocks = carve_blocks<Block>(
      at, s.n_layer, "model.layers.",
      {{&Block::norm, "input_layernorm.weight"},
       {&Block::qkv, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}}});
  ASSERT_EQ(blocks.size(), static_cast<size_t>(s.n_layer));
  for (int l = 0; l < s.n_layer; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(blocks[l].norm, buffer.data() + t.get(p + "input_layernorm.weight").offset);
    EXPECT_EQ(blocks[l].qkv, buffer.data() + t.get(p + "self_attn.q_proj.weight").offset);
  }
  // q_proj and v_proj are not neighbours: no fused GEMM can read them as one weight.
  std::string msg = error_of(
      [&] { at.fused({"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight"}); });
  EXPECT_TRUE(contains(msg, "'model.layers.0.self_attn.v_proj.weight' does not follow "
                            "'model.layers.0.self_attn.q_proj.weight' contiguously"))
      << msg;
  msg = error_of([&] { at("model.layers.0.mlp.c_fc.weight"); });
  EXPECT_TRUE(contains(msg, "model.layers.0.mlp.c_fc.weight")) << msg;
}

// ---------------------------------------------------------------------------------------------------------------
// No architecture name is compared outside the family folders.

namespace {

// The code of a line without its // comment (a // inside a string literal stays).
std::string without_comment(const std::string& line) {
  bool in_string = false;
  for (size_t i = 0; i < line.size(); i++) {
    if (line[i] == '\\') {
      i++;
      continue;
    }
    if (line[i] == '"') in_string = !in_string;
    if (!in_string && line.compare(i, 2, "//") == 0) return line.substr(0, i);
  }
  return line;
}

// The patterns of a comparison with an architecture: a registered name (or Hugging Face model type / architecture)
// compared with == / != / compare / strcmp, or model.arch compared with any string literal.
std::vector<std::regex> arch_comparisons() {
  std::vector<std::regex> patterns = {
      std::regex(R"(\barch\s*(==|!=)\s*(std::string\s*\(\s*)?")"),
      std::regex(R"("\s*\)?\s*(==|!=)\s*[\w.\->()]*\barch\b)"),
      std::regex(R"(\barch\s*\.\s*(compare|find|rfind|starts_with|ends_with)\s*\(\s*")"),
  };
  std::set<std::string> names;
  for (const ModelFamily* f : model_families()) {
    names.insert(f->name);
    names.insert(f->hf.model_type);
    names.insert(f->hf.architecture);
  }
  for (const std::string& name : names) {
    const std::string q = "\"" + name + "\"";
    patterns.emplace_back("(==|!=)\\s*(std::string\\s*\\(\\s*)?" + q);
    patterns.emplace_back(q + "\\s*\\)?\\s*(==|!=)");
    patterns.emplace_back("(compare|strcmp|strncmp|strcasecmp|find|rfind)\\s*\\([^;]*" + q);
  }
  return patterns;
}

std::vector<std::string> comparisons_in(const std::string& text) {
  static const std::vector<std::regex> patterns = arch_comparisons();
  std::vector<std::string> found;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); number++) {
    const std::string code = without_comment(line);
    for (const std::regex& r : patterns)
      if (std::regex_search(code, r)) {
        found.push_back(std::to_string(number) + ": " + line);
        break;
      }
  }
  return found;
}

}  // namespace

TEST(ArchitectureNames, TheScanFindsComparisons) {
  for (const char* bad : {R"(if (spec.arch == "gpt2") return 1;)", R"(if (m.arch != "llama"))",
                          R"(return "llama" == cfg.model.arch;)", R"(x = spec.arch.compare("gpt2") == 0;)",
                          R"(if (model_type == "gpt2"))", R"(if (std::strcmp(name, "llama") == 0))",
                          R"(bool b = architecture != "LlamaForCausalLM";)", R"(s.arch == std::string("gpt2"))"})
    EXPECT_EQ(comparisons_in(bad).size(), 1u) << bad;
  for (const char* fine : {R"(if (imported.arch != configured.arch) mismatch("arch");)",
                           R"(// if (spec.arch == "gpt2") in a comment)",
                           R"(const ModelFamily& f = model_family(m.arch);)",
                           R"(throw_error("model.arch is '%s'; the \"gpt2\" // family", x);)"})
    EXPECT_TRUE(comparisons_in(fine).empty()) << fine;
}

TEST(ArchitectureNames, NoneIsComparedOutsideTheFamilyFolders) {
  const fs::path root = LLM8_SOURCE_DIR;
  std::vector<fs::path> files = {root / "train_gpt.cu"};
  for (const char* dir : {"llmc", "dev/tools"})
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = entry.path().extension().string();
      if (entry.is_regular_file() && (ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh"))
        files.push_back(entry.path());
    }
  std::vector<std::string> family_dirs;
  for (const ModelFamily* f : model_families())
    family_dirs.push_back((root / "llmc" / "model" / f->name).string() + "/");
  auto in_a_family_dir = [&](const std::string& path) {
    for (const std::string& d : family_dirs)
      if (path.rfind(d, 0) == 0) return true;
    return false;
  };
  size_t scanned = 0;
  for (const fs::path& file : files) {
    if (in_a_family_dir(file.string())) continue;
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    scanned++;
    for (const std::string& hit : comparisons_in(text.str()))
      ADD_FAILURE() << fs::relative(file, root).string() << ":" << hit
                    << "\n  architecture knowledge belongs to its family (llmc/model/<arch>/, asked through "
                       "model_family(spec.arch), llmc/model/family.h)";
  }
  EXPECT_GT(scanned, 50u) << "the scan found too few files under " << root;
}
