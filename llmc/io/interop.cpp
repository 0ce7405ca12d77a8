// llmc/io/interop.cpp: Hugging Face and llm.c import / export and the weights a run starts from. Formats and
// conventions are documented in interop.h; what differs between architectures (config.json keys, transposed tensors,
// buffers, llm.c's layout) comes from the model family's descriptor (llmc/model/family.h). Host code only.
#include "llmc/io/interop.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/core/file_io.h"
#include "llmc/core/input_safety.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/safetensors.h"
#include "llmc/model/family.h"

namespace fs = std::filesystem;

namespace llmc {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

constexpr const char* kHfConfigFile = "config.json";
constexpr const char* kHfWeightsFile = "model.safetensors";
constexpr const char* kHfIndexFile = "model.safetensors.index.json";
constexpr const char* kLlm8WeightsFile = "model.safetensors";
constexpr size_t kLlmcHeaderInts = 256;
constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
constexpr uint64_t kMaxHfJsonBytes = 64u << 20;  // config.json is a few KB, an index a few hundred

// Other llm.c magics, so a wrong file gets a precise message.
constexpr int kLlmcLlama3ModelMagic = 20240803;
constexpr int kLlmcDebugStateMagic = 20240327;
constexpr int kLlmcTokenizerMagic = 20240328;
constexpr int kLlmcShardMagic = 20240520;
constexpr int kLlmcShardMagicU32 = 20240801;

// ----------------------------------------------------------------------------------------------------------------
// small utilities

// bf16 bits of x, round to nearest even; NaN stays a (quiet) NaN with its sign.
uint16_t float_to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

std::string join_path(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void fsync_parent(const std::string& path) {
  int fd = ::open(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().c_str(),
                  O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort
  ::fsync(fd);
  ::close(fd);
}

// A file written under path + ".tmp", fsynced and renamed over path on commit(); removed if never committed.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_)
      throw_error("cannot create %s: %s (does the directory exist and is it writable?)", tmp_.c_str(),
                  std::strerror(errno));
  }
  ~AtomicFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  void write(const void* data, size_t nbytes) {
    if (nbytes && std::fwrite(data, 1, nbytes, f_) != nbytes)
      throw_error("cannot write %s: %s (is the disk full?)", tmp_.c_str(), std::strerror(errno));
  }
  void commit() {
    if (std::fflush(f_) != 0 || ::fsync(fileno(f_)) != 0)
      throw_error("cannot write %s: %s (is the disk full?)", tmp_.c_str(), std::strerror(errno));
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) {
      std::remove(tmp_.c_str());
      throw_error("closing %s failed: %s", tmp_.c_str(), std::strerror(errno));
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      std::remove(tmp_.c_str());
      throw_error("cannot rename %s to %s: %s", tmp_.c_str(), path_.c_str(), std::strerror(err));
    }
    fsync_parent(path_);
  }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
};

void write_text_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

// Appends values as F32 or BF16 little-endian bytes.
void append_encoded(std::vector<uint8_t>* out, const float* values, size_t n, WeightDtype dtype) {
  const size_t start = out->size();
  if (dtype == WeightDtype::F32) {
    out->resize(start + n * sizeof(float));
    std::memcpy(out->data() + start, values, n * sizeof(float));
  } else {
    out->resize(start + n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
      const uint16_t b = float_to_bf16_bits(values[i]);
      std::memcpy(out->data() + start + i * sizeof(uint16_t), &b, sizeof b);
    }
  }
}

// A model's sizes, as a config.json or an llm.c header gives them, within the bounds of the run config's keys
// (llmc/core/input_safety.h): checked before anything (the parameter table, the weights) is sized by them.
void check_model_sizes(const ModelSpec& s, const std::string& source) {
  const struct {
    const char* key;
    int64_t value, max;
  } sizes[] = {{"n_layer", s.n_layer, size_limits::kLayers},       {"n_head", s.n_head, size_limits::kHeads},
               {"n_kv_head", s.n_kv_head, size_limits::kHeads},    {"n_embd", s.n_embd, size_limits::kEmbd},
               {"vocab_size", s.vocab_size, size_limits::kVocab},  {"max_seq_len", s.max_seq_len, size_limits::kSeqLen},
               {"ffn_hidden", s.ffn_hidden, size_limits::kFfnHidden}};
  for (const auto& size : sizes)
    if (size.value > size.max)
      throw_error("%s: the model's %s is %lld, more than the %lld llm8 accepts (model.%s)", source.c_str(), size.key,
                  static_cast<long long>(size.value), static_cast<long long>(size.max), size.key);
}

// ----------------------------------------------------------------------------------------------------------------
// Hugging Face config.json: the common keys here, the family's keys from its descriptor (llmc/model/<arch>/).

ordered_json hf_config(const ModelSpec& spec, WeightDtype dtype) {
  const ModelFamily& family = model_family(spec.arch);
  ordered_json c = ordered_json::object();
  c["architectures"] = {family.hf.architecture};
  c["model_type"] = family.hf.model_type;
  family.hf.write_config(spec, &c);
  c["use_cache"] = true;
  c["torch_dtype"] = dtype == WeightDtype::F32 ? "float32" : "bfloat16";
  return c;
}

// "A (model_type a), B (model_type b) and C (model_type c)": what import reads.
std::string hf_families() {
  const std::vector<const ModelFamily*>& families = model_families();
  std::string list;
  for (size_t i = 0; i < families.size(); i++) {
    if (i > 0) list += i + 1 == families.size() ? " and " : ", ";
    list += strformat("%s (model_type %s)", families[i]->hf.architecture, families[i]->hf.model_type);
  }
  return list;
}

// The family a config.json describes, by model_type (or, without one, by its first architecture); an llmc::Error
// names anything else.
const ModelFamily& hf_family(const json& j, const std::string& path) {
  std::string model_type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>()
                                                                                    : "";
  std::string architecture;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    architecture = j["architectures"][0].get<std::string>();
  for (const ModelFamily* f : model_families())
    if (model_type == f->hf.model_type || (model_type.empty() && architecture == f->hf.architecture)) return *f;
  throw_error("%s: unknown architecture (model_type '%s', architectures [%s]): llm8 imports %s", path.c_str(),
              model_type.c_str(), architecture.c_str(), hf_families().c_str());
}

ModelSpec spec_from_hf_config(const json& j, const std::string& path) {
  if (!j.is_object()) throw_error("%s: the top level is not a JSON object", path.c_str());
  const ModelFamily& family = hf_family(j, path);
  ModelSpec s = family.hf.read_config(HfConfigReader{j, path});
  s.arch = family.name;
  return s;
}

// The tensors of a Hugging Face directory: model.safetensors, or the shards a model.safetensors.index.json lists.
class HfTensorFiles {
 public:
  explicit HfTensorFiles(const std::string& dir) {
    const std::string single = join_path(dir, kHfWeightsFile), index = join_path(dir, kHfIndexFile);
    if (fs::exists(single)) {
      add_file(single);
    } else if (fs::exists(index)) {
      const json j = read_json_file(index, "safetensors index", kMaxHfJsonBytes);
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        throw_error("%s: no \"weight_map\" object (a sharded checkpoint's index maps tensor names to shard files)",
                    index.c_str());
      std::map<std::string, size_t> shard_of_file;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          throw_error("%s: weight_map entry '%s' is not a file name", index.c_str(), it.key().c_str());
        const std::string file = it.value().get<std::string>();
        if (file.find('/') != std::string::npos)
          throw_error("%s: weight_map entry '%s' points outside the directory ('%s')", index.c_str(),
                      it.key().c_str(), file.c_str());
        if (!shard_of_file.count(file)) shard_of_file[file] = add_file(join_path(dir, file));
        const size_t shard = shard_of_file[file];
        if (!readers_[shard].has(it.key()))
          throw_error("%s: index lists tensor '%s' in %s, but that file does not hold it", index.c_str(),
                      it.key().c_str(), readers_[shard].path().c_str());
      }
    } else {
      throw_error("%s: neither %s nor %s found (a Hugging Face model directory holds the weights in safetensors)",
                  dir.c_str(), kHfWeightsFile, kHfIndexFile);
    }
  }
  const SafetensorsReader* find(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? nullptr : &readers_[it->second];
  }
  const std::map<std::string, size_t>& names() const { return where_; }
  const std::string& description() const { return description_; }

 private:
  size_t add_file(const std::string& path) {
    readers_.emplace_back(path);
    const size_t index = readers_.size() - 1;
    for (const TensorEntry& e : readers_.back().tensors()) {
      auto [it, inserted] = where_.emplace(e.name, index);
      if (!inserted)
        throw_error("tensor '%s' is in both %s and %s", e.name.c_str(), readers_[it->second].path().c_str(),
                    path.c_str());
    }
    description_ += (description_.empty() ? "" : ", ") + path;
    return index;
  }
  std::vector<SafetensorsReader> readers_;
  std::map<std::string, size_t> where_;  // tensor name -> reader
  std::string description_;
};

// Copies a tensor in Hugging Face layout (hf, hf_shape) into our layout at dst.
void hf_to_ours(const HfTensorMapping& m, const ParamInfo& p, const std::vector<float>& hf, float* dst) {
  if (m.transposed) {  // hf (in, out) -> ours (out, in)
    const size_t out = static_cast<size_t>(p.shape[0]), in = static_cast<size_t>(p.shape[1]);
    for (size_t i = 0; i < in; i++)
      for (size_t o = 0; o < out; o++) dst[o * in + i] = hf[i * out + o];
  } else {
    std::copy(hf.begin(), hf.end(), dst);  // vocabulary rows: the padded rows after them stay 0
  }
}

// Our tensor (at src) in Hugging Face layout.
std::vector<float> ours_to_hf(const HfTensorMapping& m, const ParamInfo& p, const float* src) {
  const size_t numel = shape_numel(m.hf_shape);
  std::vector<float> hf(numel);
  if (m.transposed) {  // ours (out, in) -> hf (in, out)
    const size_t out = static_cast<size_t>(p.shape[0]), in = static_cast<size_t>(p.shape[1]);
    for (size_t o = 0; o < out; o++)
      for (size_t i = 0; i < in; i++) hf[i * out + o] = src[o * in + i];
  } else {
    std::copy(src, src + numel, hf.begin());  // vocabulary rows: the first V rows only
  }
  return hf;
}

// ----------------------------------------------------------------------------------------------------------------
// llm.c: the tensors of the model file are those of the family's llm.c layout (llmc/model/family.h, LlmcFormat),
// by our names.

// The family llm.c's model files hold (the first registered family with an llm.c layout).
const ModelFamily& llmc_family() {
  for (const ModelFamily* f : model_families())
    if (f->llmc) return *f;
  throw_error("llm.c model files: no model family of this build has llm.c's layout");
}

// The table entries (in layer order) that make up one llm.c tensor.
std::vector<const ParamInfo*> llmc_parts(const ParamTable& table, const LlmcFormat::Tensor& t, int n_layer) {
  const std::string pattern = t.table_name;
  const size_t brace = pattern.find("{}");
  std::vector<const ParamInfo*> parts;
  if (brace == std::string::npos) {
    parts.push_back(&table.get(pattern));
  } else {
    for (int l = 0; l < n_layer; l++)
      parts.push_back(&table.get(pattern.substr(0, brace) + std::to_string(l) + pattern.substr(brace + 2)));
  }
  return parts;
}

void check_llmc_exportable(const ModelSpec& spec, const std::string& path) {
  const ModelFamily& family = model_family(spec.arch);
  if (!family.llmc)
    throw_error("%s: llm.c model files hold %s models only (model.arch is '%s'); use --export-hf", path.c_str(),
                llmc_family().title, spec.arch.c_str());
  family.llmc->check(spec, path);
}

// ----------------------------------------------------------------------------------------------------------------
// Spec comparison for imports into a configured run.

void check_same_spec(const ModelSpec& imported, const ModelSpec& configured, const std::string& source) {
  auto mismatch = [&](const char* key, const std::string& have, const std::string& want) {
    throw_error("train.init_from %s: the imported model has model.%s = %s but the config says %s: set model.%s to %s "
                "(the model section must describe the imported model)",
                source.c_str(), key, have.c_str(), want.c_str(), key, have.c_str());
  };
  auto check_int = [&](const char* key, int have, int want) {
    if (have != want) mismatch(key, std::to_string(have), std::to_string(want));
  };
  if (imported.arch != configured.arch) mismatch("arch", "\"" + imported.arch + "\"", "\"" + configured.arch + "\"");
  check_int("n_layer", imported.n_layer, configured.n_layer);
  check_int("n_head", imported.n_head, configured.n_head);
  check_int("n_kv_head", imported.n_kv_head, configured.n_kv_head);
  check_int("n_embd", imported.n_embd, configured.n_embd);
  check_int("vocab_size", imported.vocab_size, configured.vocab_size);
  check_int("max_seq_len", imported.max_seq_len, configured.max_seq_len);
  check_int("ffn_hidden", imported.ffn_hidden, configured.ffn_hidden);
  if (imported.norm_eps != configured.norm_eps)
    mismatch("norm_eps", json(shortest_decimal(imported.norm_eps)).dump(),
             json(shortest_decimal(configured.norm_eps)).dump());
  if (imported.tied_embeddings != configured.tied_embeddings)
    mismatch("tied_embeddings", imported.tied_embeddings ? "true" : "false",
             configured.tied_embeddings ? "true" : "false");
  if (model_family(imported.arch).uses_rope_theta && imported.rope_theta != configured.rope_theta)
    mismatch("rope_theta", json(shortest_decimal(imported.rope_theta)).dump(),
             json(shortest_decimal(configured.rope_theta)).dump());
}

// Copies src (any vocabulary padding) into dst laid out by dst_table (same model otherwise), by tensor name.
void copy_by_name(const ModelWeights& src, const ModelSpec& dst_spec, const ParamTable& dst_table, float* dst) {
  std::fill(dst, dst + dst_table.total_elements, 0.0f);
  for (const ParamInfo& p : dst_table.params) {
    const ParamInfo& q = src.table.get(p.name);
    const bool vocab = hf_mapping(dst_spec, p).vocab_rows;
    const size_t n = vocab ? static_cast<size_t>(dst_spec.vocab_size) * static_cast<size_t>(p.shape[1]) : p.numel;
    if (n > q.numel || n > p.numel) throw_error("internal error: tensor '%s' does not fit", p.name.c_str());
    std::copy(src.values.begin() + q.offset, src.values.begin() + q.offset + n, dst + p.offset);
  }
}

// Our model.safetensors (a checkpoint's, or a file): every tensor of the table by name, F32, the table's shape.
void read_llm8_weights(const std::string& path, const ParamTable& table, float* values) {
  SafetensorsReader reader(path);
  std::fill(values, values + table.total_elements, 0.0f);
  for (const ParamInfo& p : table.params) {
    if (!reader.has(p.name))
      throw_error("%s: no tensor '%s' (is this a checkpoint of another model config? Hugging Face directories and "
                  "llm.c .bin files are recognised by config.json and by their magic)",
                  path.c_str(), p.name.c_str());
    const TensorEntry& e = reader.entry(p.name);
    if (e.dtype != "F32" || e.shape != p.shape)
      throw_error("%s: tensor '%s' is %s %s; the model needs F32 %s (is this checkpoint from another model config?)",
                  path.c_str(), p.name.c_str(), e.dtype.c_str(), shape_str(e.shape).c_str(),
                  shape_str(p.shape).c_str());
    reader.read_into(p.name, values + p.offset, p.numel * sizeof(float));
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// dtypes

WeightDtype parse_weight_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "f32") return WeightDtype::F32;
  if (name == "bfloat16" || name == "bf16") return WeightDtype::BF16;
  throw_error("unknown weight dtype '%s' (choices: float32, bfloat16)", name.c_str());
}

const char* weight_dtype_name(WeightDtype dtype) { return dtype == WeightDtype::F32 ? "float32" : "bfloat16"; }

// ------------------------------------------------------------------------------------------------------------------
// Hugging Face

HfTensorMapping hf_mapping(const ModelSpec& spec, const ParamInfo& p) {
  HfTensorMapping m;
  m.hf_name = p.name;  // our names are Hugging Face's
  m.hf_shape = p.shape;
  m.vocab_rows = p.role == ParamRole::TokenEmbedding || p.role == ParamRole::LmHead;
  if (m.vocab_rows) m.hf_shape[0] = spec.vocab_size;
  const HfFormat& hf = model_family(spec.arch).hf;
  m.transposed = hf.transposed && hf.transposed(p.name);
  if (m.transposed) std::swap(m.hf_shape[0], m.hf_shape[1]);
  return m;
}

std::vector<std::string> export_hf(const std::string& dir, const ModelSpec& spec, const float* values,
                                   WeightDtype dtype) {
  const ordered_json config = hf_config(spec, dtype);
  const ParamTable table = build_param_table(spec);
  if (fs::exists(dir) && !fs::is_directory(dir))
    throw_error("Hugging Face export: %s exists and is not a directory", dir.c_str());
  if (fs::exists(join_path(dir, kHfIndexFile)))
    throw_error("Hugging Face export: %s already holds a sharded checkpoint (%s) that would shadow the export: "
                "choose an empty directory", dir.c_str(), kHfIndexFile);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_error("Hugging Face export: cannot create directory %s: %s", dir.c_str(), ec.message().c_str());

  SafetensorsWriter writer;
  for (const ParamInfo& p : table.params) {
    const HfTensorMapping m = hf_mapping(spec, p);
    const std::vector<float> hf = ours_to_hf(m, p, values + p.offset);
    std::vector<uint8_t> bytes;
    append_encoded(&bytes, hf.data(), hf.size(), dtype);
    writer.add(m.hf_name, dtype == WeightDtype::F32 ? "F32" : "BF16", m.hf_shape, std::move(bytes));
  }
  writer.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  const std::string weights_path = join_path(dir, kHfWeightsFile), config_path = join_path(dir, kHfConfigFile);
  writer.write(weights_path);
  write_text_atomic(config_path, config.dump(2) + "\n");  // last: a directory with config.json is complete
  return {config_path, weights_path};
}

ModelWeights import_hf(const std::string& dir, int padded_vocab_multiple) {
  if (!fs::is_directory(dir)) throw_error("Hugging Face import: %s is not a directory", dir.c_str());
  const std::string config_path = join_path(dir, kHfConfigFile);
  if (!fs::exists(config_path))
    throw_error("Hugging Face import: %s has no %s (a Hugging Face model directory holds config.json and "
                "model.safetensors)", dir.c_str(), kHfConfigFile);
  ModelWeights w;
  w.spec = spec_from_hf_config(read_json_file(config_path, "Hugging Face config", kMaxHfJsonBytes), config_path);
  check_model_sizes(w.spec, config_path);
  const HfFormat& hf = model_family(w.spec.arch).hf;
  const std::string optional_prefix = hf.optional_prefix;
  w.spec.padded_vocab_size = static_cast<int>(round_up(w.spec.vocab_size, std::max(1, padded_vocab_multiple)));
  w.table = build_param_table(w.spec);

  // The weights must be there before they are allocated: the tensors config.json describes need at least 2 bytes
  // (BF16, F16) per element of their Hugging Face shapes.
  const HfTensorFiles files(dir);
  int64_t need_bytes = 0, have_bytes = 0;
  for (const ParamInfo& p : w.table.params)
    need_bytes = checked_add(need_bytes, checked_mul(2, static_cast<int64_t>(shape_numel(hf_mapping(w.spec, p).hf_shape)),
                                                     "tensor bytes"), "weight bytes");
  for (const auto& [name, index] : files.names())
    have_bytes = checked_add(have_bytes, static_cast<int64_t>(files.find(name)->entry(name).nbytes), "weight bytes");
  if (have_bytes < need_bytes)
    throw_error("%s: the %s model that %s describes needs at least %lld bytes of weights, but the files hold %lld: "
                "config.json does not describe these weights", files.description().c_str(), w.spec.arch.c_str(),
                config_path.c_str(), static_cast<long long>(need_bytes), static_cast<long long>(have_bytes));
  w.values.assign(w.table.total_elements, 0.0f);

  std::set<std::string> used;
  std::vector<std::string> missing;
  const HfTensorMapping* embedding = nullptr;
  std::vector<HfTensorMapping> mappings;
  mappings.reserve(w.table.params.size());
  for (const ParamInfo& p : w.table.params) {
    mappings.push_back(hf_mapping(w.spec, p));
    HfTensorMapping& m = mappings.back();
    if (p.role == ParamRole::TokenEmbedding) embedding = &m;
    std::string name = m.hf_name;
    // Some checkpoints leave a prefix out (GPT2Model's, the Hub's openai-community/gpt2: "transformer.").
    if (!files.find(name) && !optional_prefix.empty() && name.rfind(optional_prefix, 0) == 0 &&
        files.find(name.substr(optional_prefix.size())))
      name = name.substr(optional_prefix.size());
    const SafetensorsReader* reader = files.find(name);
    if (!reader) {
      missing.push_back(m.hf_name);
      continue;
    }
    used.insert(name);
    m.hf_name = name;
    const TensorEntry& e = reader->entry(name);
    if (e.shape != m.hf_shape)
      throw_error("%s: tensor '%s' has shape %s, but %s describes %s", reader->path().c_str(), name.c_str(),
                  shape_str(e.shape).c_str(), config_path.c_str(), shape_str(m.hf_shape).c_str());
    if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16")
      throw_error("%s: tensor '%s' is %s; import reads F32, BF16 and F16", reader->path().c_str(), name.c_str(),
                  e.dtype.c_str());
    hf_to_ours(m, p, reader->read_as_float(name), w.values.data() + p.offset);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; i++) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += strformat(", ... (%zu in all)", missing.size());
    throw_error("%s: %zu tensor(s) of the model that %s describes are missing: %s", files.description().c_str(),
                missing.size(), config_path.c_str(), list.c_str());
  }
  for (const auto& [name, index] : files.names()) {
    if (used.count(name) || hf.is_buffer(name)) continue;
    const SafetensorsReader* reader = files.find(name);
    if (name == "lm_head.weight" && w.spec.tied_embeddings && embedding) {  // (tied: not in our table)
      // A tied lm_head saved anyway (older checkpoints): it must be the embedding.
      const std::vector<float> head = reader->read_as_float(name);
      const std::vector<float> emb = files.find(embedding->hf_name)->read_as_float(embedding->hf_name);
      if (head != emb)
        throw_error("%s: tensor 'lm_head.weight' differs from '%s', but %s says the embeddings are tied",
                    reader->path().c_str(), embedding->hf_name.c_str(), config_path.c_str());
      continue;
    }
    throw_error("%s: unexpected tensor '%s' (%s %s): it is not part of the %s model %s describes",
                reader->path().c_str(), name.c_str(), reader->entry(name).dtype.c_str(),
                shape_str(reader->entry(name).shape).c_str(), w.spec.arch.c_str(), config_path.c_str());
  }
  return w;
}

// ------------------------------------------------------------------------------------------------------------------
// llm.c

void export_llmc(const std::string& path, const ModelSpec& spec, const float* values, WeightDtype dtype) {
  check_llmc_exportable(spec, path);
  const ParamTable table = build_param_table(spec);
  int32_t header[kLlmcHeaderInts] = {0};
  header[0] = kLlmcModelMagic;
  header[1] = dtype == WeightDtype::F32 ? kLlmcVersionF32 : kLlmcVersionBF16;
  header[2] = spec.max_seq_len;
  header[3] = spec.vocab_size;
  header[4] = spec.n_layer;
  header[5] = spec.n_head;
  header[6] = spec.n_embd;
  header[7] = spec.padded_vocab_size;
  AtomicFile file(path);
  file.write(header, sizeof(header));
  std::vector<uint8_t> bytes;
  for (const LlmcFormat::Tensor& t : model_family(spec.arch).llmc->tensors) {
    for (const ParamInfo* p : llmc_parts(table, t, spec.n_layer)) {
      bytes.clear();
      size_t real = p->numel;
      if (p->role == ParamRole::TokenEmbedding)  // the padded rows are written as zeros, as llm.c's writer does
        real = static_cast<size_t>(spec.vocab_size) * static_cast<size_t>(p->shape[1]);
      append_encoded(&bytes, values + p->offset, real, dtype);
      bytes.resize(bytes.size() + (p->numel - real) * (dtype == WeightDtype::F32 ? 4 : 2), 0);
      file.write(bytes.data(), bytes.size());
    }
  }
  file.commit();
}

ModelWeights import_llmc(const std::string& path) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, "llm.c model file", &size);
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) {
    ::close(*f);
    delete f;
  });
  const size_t file_size = static_cast<size_t>(size);
  auto read_at = [&](size_t offset, void* dst, size_t nbytes) {
    const IoResult r = pread_fully(fd, dst, nbytes, offset);
    if (!r.ok()) throw_error("llm.c import: cannot read %s: %s", path.c_str(), r.what());
  };
  if (file_size < kLlmcHeaderBytes)
    throw_error("llm.c import: %s is %zu bytes, too short for the 1024-byte header of an llm.c model file",
                path.c_str(), file_size);
  int32_t h[kLlmcHeaderInts];
  read_at(0, h, kLlmcHeaderBytes);
  switch (h[0]) {
    case kLlmcModelMagic: break;
    case kLlmcLlama3ModelMagic:
      throw_error("llm.c import: %s is an llm.c Llama 3 model file (magic %d): not supported, import Llama models "
                  "from a Hugging Face directory", path.c_str(), h[0]);
    case kLlmcDebugStateMagic:
      throw_error("llm.c import: %s is an llm.c debug state (magic %d), not a model file", path.c_str(), h[0]);
    case kLlmcTokenizerMagic:
      throw_error("llm.c import: %s is an llm.c tokenizer file (magic %d), not a model file", path.c_str(), h[0]);
    case kLlmcShardMagic:
    case kLlmcShardMagicU32:
      throw_error("llm.c import: %s is a token shard (magic %d), not a model file", path.c_str(), h[0]);
    default:
      throw_error("llm.c import: %s: bad magic %d: not an llm.c model file (expected %d)", path.c_str(), h[0],
                  kLlmcModelMagic);
  }
  if (h[1] != kLlmcVersionF32 && h[1] != kLlmcVersionBF16)
    throw_error("llm.c import: %s: version %d is not supported (3 = FP32, 5 = BF16; older versions predate the padded "
                "vocabulary: re-export with llm.c's train_gpt2.py)", path.c_str(), h[1]);
  const WeightDtype dtype = h[1] == kLlmcVersionF32 ? WeightDtype::F32 : WeightDtype::BF16;
  const char* names[] = {"maxT", "V", "L", "NH", "C", "Vp"};
  for (int i = 2; i <= 7; i++)
    if (h[i] < 1 || h[i] > (1 << 24))
      throw_error("llm.c import: %s: header field %s = %d is out of range", path.c_str(), names[i - 2], h[i]);
  const ModelFamily& family = llmc_family();
  ModelWeights w;
  w.spec = family.llmc->spec_from_header(h[2], h[3], h[4], h[5], h[6], h[7]);
  w.spec.arch = family.name;
  if (w.spec.padded_vocab_size < w.spec.vocab_size || w.spec.n_embd % w.spec.n_head != 0)
    throw_error("llm.c import: %s: inconsistent header (V %d, Vp %d, C %d, NH %d)", path.c_str(), w.spec.vocab_size,
                w.spec.padded_vocab_size, w.spec.n_embd, w.spec.n_head);
  check_model_sizes(w.spec, "llm.c import: " + path);
  w.table = build_param_table(w.spec);  // small: the sizes are bounded; checked against the file size below
  const size_t elem = dtype == WeightDtype::F32 ? 4 : 2;
  const size_t expected = kLlmcHeaderBytes + w.table.num_parameters * elem;
  if (file_size != expected)
    throw_error("llm.c import: %s is %zu bytes, but a version %d model with maxT %d, V %d, L %d, NH %d, C %d, Vp %d "
                "needs %zu: truncated, or not written by llm.c", path.c_str(), file_size, h[1], h[2], h[3], h[4],
                h[5], h[6], h[7], expected);
  w.values.assign(w.table.total_elements, 0.0f);
  size_t offset = kLlmcHeaderBytes;
  std::vector<uint16_t> bits;
  for (const LlmcFormat::Tensor& t : family.llmc->tensors) {
    for (const ParamInfo* p : llmc_parts(w.table, t, w.spec.n_layer)) {
      float* dst = w.values.data() + p->offset;
      if (dtype == WeightDtype::F32) {
        read_at(offset, dst, p->numel * sizeof(float));
      } else {
        bits.resize(p->numel);
        read_at(offset, bits.data(), p->numel * sizeof(uint16_t));
        for (size_t i = 0; i < p->numel; i++) dst[i] = bf16_bits_to_float(bits[i]);
      }
      offset += p->numel * elem;
      if (p->role == ParamRole::TokenEmbedding)  // rows past V are padding: zero, as llm.c keeps them
        std::fill(dst + static_cast<size_t>(w.spec.vocab_size) * static_cast<size_t>(p->shape[1]), dst + p->numel,
                  0.0f);
    }
  }
  return w;
}

// ------------------------------------------------------------------------------------------------------------------
// Weights for a run

WeightsFormat detect_weights_format(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw_error("%s does not exist", path.c_str());
  if (fs::is_directory(status))
    return fs::exists(join_path(path, kHfConfigFile)) ? WeightsFormat::HuggingFace : WeightsFormat::Llm8;
  check_regular_file(path, "model file");  // a FIFO would block the read of the magic below
  int32_t magic = 0;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    if (std::fread(&magic, sizeof magic, 1, f) != 1) magic = 0;
    std::fclose(f);
  }
  switch (magic) {
    case kLlmcModelMagic:
    case kLlmcLlama3ModelMagic:  // import_llmc names it
    case kLlmcDebugStateMagic:
    case kLlmcTokenizerMagic:
    case kLlmcShardMagic:
    case kLlmcShardMagicU32: return WeightsFormat::Llmc;
    default: return WeightsFormat::Llm8;
  }
}

std::string load_weights(const std::string& path, const ModelSpec& spec, float* values) {
  const ParamTable table = build_param_table(spec);
  switch (detect_weights_format(path)) {
    case WeightsFormat::HuggingFace: {
      const ModelWeights w = import_hf(path, /*padded_vocab_multiple=*/1);  // copy_by_name pads for spec
      check_same_spec(w.spec, spec, path + "/" + kHfConfigFile);
      copy_by_name(w, spec, table, values);
      return "Hugging Face directory " + path + " (" + w.spec.arch + ")";
    }
    case WeightsFormat::Llmc: {
      const ModelWeights w = import_llmc(path);
      check_same_spec(w.spec, spec, path);
      copy_by_name(w, spec, table, values);
      return "llm.c model file " + path;
    }
    case WeightsFormat::Llm8: break;
  }
  std::string file = path;
  if (fs::is_directory(path)) {
    file = join_path(path, kLlm8WeightsFile);
    if (!fs::exists(file))
      throw_error("%s holds neither config.json (a Hugging Face model) nor %s (an llm8 checkpoint step directory)",
                  path.c_str(), kLlm8WeightsFile);
  }
  read_llm8_weights(file, table, values);
  return "llm8 weights " + file;
}

void check_exportable(const ModelSpec& spec, const std::string& llmc_path, WeightDtype dtype) {
  if (!llmc_path.empty()) check_llmc_exportable(spec, llmc_path);
  hf_config(spec, dtype);
}

}  // namespace llmc
