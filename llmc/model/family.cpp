// llmc/model/family.cpp: the registry of model families (the one list of them), preset specs, the typed config.json
// reader and the parameter-table helpers the families' table builders share (llmc/model/family.h). Host code only.
#include "llmc/model/family.h"

#include <cstdio>
#include <cstdlib>

#include "llmc/core/common.h"
#include "llmc/core/input_safety.h"

namespace llmc {

// The families: each defined in its folder, llmc/model/<name>/<name>_family.cpp.
const ModelFamily& gpt2_family();
const ModelFamily& llama_family();

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families = {&gpt2_family(), &llama_family()};
  return families;
}

std::vector<std::string> model_family_names() {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) names.push_back(f->name);
  return names;
}

const ModelFamily* find_model_family(const std::string& name) {
  for (const ModelFamily* f : model_families())
    if (name == f->name) return f;
  return nullptr;
}

const ModelFamily& model_family(const std::string& name) {
  if (const ModelFamily* f = find_model_family(name)) return *f;
  std::string known;
  for (const std::string& n : model_family_names()) known += (known.empty() ? "" : ", ") + n;
  throw_error("model.arch: unknown architecture '%s' (supported: %s)", name.c_str(), known.c_str());
}

ModelSpec preset_spec(const ModelFamily& family, const ModelPreset& preset) {
  ModelSpec s;
  s.arch = family.name;
  s.n_layer = preset.n_layer;
  s.n_head = preset.n_head;
  s.n_kv_head = preset.n_kv_head > 0 ? preset.n_kv_head : preset.n_head;
  s.n_embd = preset.n_embd;
  s.vocab_size = 50257;         // the GPT-2 tokenizer of our data
  s.padded_vocab_size = 50304;  // 50257 rounded up to a multiple of 128
  s.max_seq_len = preset.max_seq_len;
  s.ffn_hidden = preset.ffn_hidden > 0 ? preset.ffn_hidden : family.default_ffn_hidden(preset.n_embd);
  s.tied_embeddings = preset.tied_embeddings;
  s.norm_eps = 1e-5f;
  if (preset.rope_theta > 0) s.rope_theta = preset.rope_theta;
  return s;
}

// ------------------------------------------------------------------------------------------------------------------
// config.json

bool HfConfigReader::has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

int HfConfigReader::get_int(const char* key) const {
  if (!has(key)) throw_error("%s: key '%s' is missing", path.c_str(), key);
  const nlohmann::json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > size_limits::kVocab)
    throw_error("%s: '%s' must be a positive integer of at most %lld, got %s", path.c_str(), key,
                static_cast<long long>(size_limits::kVocab), v.dump().c_str());
  return v.get<int>();
}

int HfConfigReader::get_int(const char* key, int fallback) const { return has(key) ? get_int(key) : fallback; }

double HfConfigReader::get_number(const char* key, double fallback) const {
  if (!has(key)) return fallback;
  if (!j[key].is_number()) throw_error("%s: '%s' must be a number, got %s", path.c_str(), key, j[key].dump().c_str());
  return j[key].get<double>();
}

bool HfConfigReader::get_bool(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!j[key].is_boolean())
    throw_error("%s: '%s' must be true or false, got %s", path.c_str(), key, j[key].dump().c_str());
  return j[key].get<bool>();
}

std::string HfConfigReader::get_string(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  if (!j[key].is_string()) throw_error("%s: '%s' must be a string, got %s", path.c_str(), key, j[key].dump().c_str());
  return j[key].get<std::string>();
}

double shortest_decimal(float v) {
  char buf[32];
  for (int precision = 6; precision <= 9; precision++) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, static_cast<double>(v));
    if (static_cast<float>(std::strtod(buf, nullptr)) == v) break;
  }
  return std::strtod(buf, nullptr);
}

// ------------------------------------------------------------------------------------------------------------------
// Parameter tables

void add_param(ParamTable* table, const std::string& name, std::vector<int64_t> shape, int layer, ParamRole role,
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

void add_fused_params(ParamTable* table, const std::vector<std::pair<std::string, int64_t>>& rows, int64_t in,
                      int layer, float init_std) {
  const size_t first = table->params.size();
  for (const auto& [name, out] : rows) add_param(table, name, {out, in}, layer, ParamRole::LinearWeight, init_std, 0);
  // The 128-element alignment leaves no gap when each numel is a multiple of 128.
  for (size_t i = first + 1; i < table->params.size(); i++) {
    const ParamInfo& prev = table->params[i - 1];
    if (prev.offset + prev.numel != table->params[i].offset)
      throw_error("parameter table: '%s' (%zu elements) is not a multiple of %zu elements, so '%s' does not follow it "
                  "contiguously and the fused GEMM cannot read them as one weight (choose sizes whose products are "
                  "multiples of %zu)",
                  prev.name.c_str(), prev.numel, ParamTable::kAlign, table->params[i].name.c_str(), ParamTable::kAlign);
  }
}

}  // namespace llmc
