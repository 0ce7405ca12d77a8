// llmc/model/family.h: the model-family registry. A model family (GPT-2, Llama) is one ModelFamily value that holds
// everything llm8 knows about the architecture outside its GPU code: its name (model.arch), presets, parameter table,
// validation, default MLP width, the Hugging Face config and tensor layout, whether llm.c's model
// file can hold it, its --dry-run details and the factory of its GPU model (llmc/model/model.h). The rest of llm8 asks
// the registry (model_family(spec.arch)) and never compares architecture names; FLOPs per token and parameter counts
// follow from the parameter table's roles for every family (llmc/model/model_spec.h).
//
// How to add a model family
//   1. A folder llmc/model/<name>/ with the GPU model: a class derived from Model (llmc/model/model.h) that carves its
//      tensors with ParamViews / carve_blocks, creates its linears with make_linear, lays out its activations with
//      plan_activations and input_buffer, passes x_from_producer / dy_from_producer to its linears, and orders the
//      kernel calls of its forward and backward.
//   2. A file llmc/model/<name>/<name>_family.cpp that defines `const ModelFamily& <name>_family()`: the descriptor
//      below (presets, parameter table with Hugging Face names, validation naming the model.* key and the fix, default
//      FFN width, Hugging Face config and tensor mapping, llm.c layout or null, dry-run details,
//      and make_model_of<TheClass> as the factory).
//   3. One registration: declare it and list it in model_families() (llmc/model/family.cpp).
//   4. Tests and docs: test/model/test_model_family.cpp checks every registered family (presets through validation,
//      table, FLOPs and the memory plan; the Hugging Face config round trip; no name comparisons outside the folder) once the
//      name is added to its expected list; add a parity test of the GPU model against a PyTorch reference
//      (test/model/test_<name>_parity.cu, dev/reference/), and the name and presets to the help of model.arch /
//      model.preset (llmc/run/config.cpp) and to configs/README.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/model/model_spec.h"
#include "llmc/precision/precision_state.h"
#include "llmc/precision/recipe.h"

namespace llmc {

class Model;  // llmc/model/model.h

// A named model shape. Fields a family does not use keep ModelSpec's defaults; every preset has the GPT-2 vocabulary
// of our data (50,257 tokens padded to 50,304) and norm epsilon 1e-5.
struct ModelPreset {
  const char* name;     // "gpt2-124m": the family's name, a dash, the size
  int n_layer;
  int n_head;
  int n_kv_head;        // 0: n_head (no grouped-query attention)
  int n_embd;
  int ffn_hidden;       // 0: the family's default width for n_embd
  int max_seq_len;
  float rope_theta;     // 0: ModelSpec's default (and unused by families without RoPE)
  bool tied_embeddings;
};

// Typed reads of a Hugging Face config.json whose errors name the file and the key.
struct HfConfigReader {
  const nlohmann::json& j;
  const std::string& path;
  bool has(const char* key) const;  // present and not null
  int get_int(const char* key) const;  // a positive integer; required
  int get_int(const char* key, int fallback) const;
  double get_number(const char* key, double fallback) const;
  bool get_bool(const char* key, bool fallback) const;
  std::string get_string(const char* key, const std::string& fallback) const;
};

// A float as the shortest decimal that reads back to the same float (1e-05, not 9.99999974737875e-06), for JSON.
double shortest_decimal(float v);

// How the family looks to Hugging Face transformers.
struct HfFormat {
  const char* architecture;  // config.json "architectures": "GPT2LMHeadModel"
  const char* model_type;    // config.json "model_type": "gpt2"
  // The family's keys of config.json, written after "architectures" and "model_type" (the common "use_cache" and
  // "torch_dtype" follow). Throws what the format cannot represent.
  void (*write_config)(const ModelSpec& spec, nlohmann::ordered_json* config);
  // The spec a config.json of this family describes (arch and padded_vocab_size are set by the caller); throws
  // naming the file and the key for anything the family cannot build.
  ModelSpec (*read_config)(const HfConfigReader& config);
  // Whether Hugging Face stores the tensor transposed, as (in, out) (GPT-2's Conv1D weights); null: none is.
  bool (*transposed)(const std::string& name);
  // Whether a tensor of a Hugging Face checkpoint is a buffer, not a parameter (never exported, ignored on import).
  bool (*is_buffer)(const std::string& name);
  // A prefix of our names that some checkpoints leave out ("transformer." in GPT2Model's); "" if none.
  const char* optional_prefix;
};

// karpathy/llm.c's model file (header of 256 int32: magic, version, maxT, V, L, NH, C, Vp; then the tensors stacked
// over the blocks), for a family whose layout it can hold.
struct LlmcFormat {
  struct Tensor {
    const char* llmc_name;   // "qkvw"
    const char* table_name;  // "transformer.h.{}.attn.c_attn.weight": "{}" is the block index (stacked over blocks)
  };
  std::vector<Tensor> tensors;  // in file order
  // Throws what the file cannot hold, naming path and the model.* key.
  void (*check)(const ModelSpec& spec, const std::string& path);
  // The spec of a header's sizes (arch is set by the caller).
  ModelSpec (*spec_from_header)(int max_seq_len, int vocab_size, int n_layer, int n_head, int n_embd,
                                int padded_vocab_size);
};

struct ModelFamily {
  const char* name;   // model.arch: "gpt2"; also the folder llmc/model/<name>/
  const char* title;  // in messages: "GPT-2"
  std::vector<ModelPreset> presets;
  // The parameter table (Hugging Face names, nn.Linear (out, in) layout, add_param / add_fused_params) of a spec that
  // passed build_param_table's generic checks; throws what the family cannot build.
  ParamTable (*build_param_table)(const ModelSpec& spec);
  // What the family cannot build or run, as an llmc::Error naming the model.* key and the fix (the generic checks,
  // divisibility and supported head sizes, come first in validate_config).
  void (*validate)(const ModelSpec& spec);
  // ffn_hidden when the config does not give it.
  int (*default_ffn_hidden)(int n_embd);
  // Appended to the --dry-run model line: the shape details the generic line does not show ("" if none).
  std::string (*dry_run_details)(const ModelSpec& spec);
  // model.rope_theta is part of the model (an imported model must match it).
  bool uses_rope_theta;
  HfFormat hf;
  const LlmcFormat* llmc;  // null: llm.c's model file cannot hold this family
  // The GPU model for micro-batches up to (B, T) (llmc/model/model.h, make_model; DeviceMemory::Count: its memory
  // plan, nothing allocated).
  std::unique_ptr<Model> (*make_model)(const ModelSpec& spec, int B, int T, int recompute,
                                       const PrecisionRecipe& recipe, DeviceMemory memory);
};

// Every family of this build, in the order presets and messages list them.
const std::vector<const ModelFamily*>& model_families();
std::vector<std::string> model_family_names();
// The family named `name`, or null.
const ModelFamily* find_model_family(const std::string& name);
// The family named `name`; an llmc::Error names model.arch and lists the known families otherwise.
const ModelFamily& model_family(const std::string& name);

// The factory of a family whose GPU model is the class ModelClass (constructed as ModelClass(spec, B, T, recompute,
// recipe, memory)).
template <typename ModelClass>
std::unique_ptr<Model> make_model_of(const ModelSpec& spec, int B, int T, int recompute,
                                     const PrecisionRecipe& recipe, DeviceMemory memory) {
  return std::make_unique<ModelClass>(spec, B, T, recompute, recipe, memory);
}

// The spec of a preset of `family`.
ModelSpec preset_spec(const ModelFamily& family, const ModelPreset& preset);

// For the families' table builders: GPT-2's initialisation std (Radford et al. 2019), used by every family.
constexpr float kInitStd = 0.02f;
// Appends one tensor at the next 128-element aligned offset (weight decay for 2-D tensors).
void add_param(ParamTable* table, const std::string& name, std::vector<int64_t> shape, int layer, ParamRole role,
               float init_std, float init_value);
// Appends the tensors (name, out rows) of (rows, in) that one fused GEMM reads as a single weight (q|k|v, gate|up)
// and checks that they are back to back (an llmc::Error names them otherwise).
void add_fused_params(ParamTable* table, const std::vector<std::pair<std::string, int64_t>>& rows, int64_t in,
                      int layer, float init_std);

}  // namespace llmc
