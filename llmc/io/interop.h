// llmc/io/interop.h: model weights in other programs' formats (host code only, no GPU).
//
// Our side is always a ModelSpec plus FP32 values laid out by its ParamTable (the arrays model.safetensors holds:
// table.total_elements floats, alignment gaps and the padded vocabulary rows 0). The other side is one of:
//
//   Hugging Face   a directory with config.json + model.safetensors that `transformers` loads as the model family's
//                  class (GPT2LMHeadModel for arch gpt2, LlamaForCausalLM for arch llama: the family's descriptor,
//                  llmc/model/family.h, holds its config.json keys and tensor layout). Our parameter names ARE the
//                  Hugging Face names, so the mapping is table-driven: per tensor only (a) the vocabulary rows past the
//                  real vocabulary are dropped (export) or added back as zeros (import) for the token embedding and an
//                  untied lm_head, and (b) the tensors the family stores transposed (GPT-2's Conv1D weights attn.c_attn,
//                  attn.c_proj, mlp.c_fc, mlp.c_proj, stored by Hugging Face as (in, out)) are transposed from / to our
//                  nn.Linear (out, in) layout. Export writes F32 or BF16; import reads F32 / BF16 / F16 tensors from
//                  model.safetensors or from a sharded checkpoint (model.safetensors.index.json + its shards), with or
//                  without the prefix a family's checkpoints may leave out (GPT-2's "transformer.").
//
//   llm.c          karpathy/llm.c's GPT-2 model file (train_gpt2.py writes it, train_gpt2.cu reads it), for the family
//                  whose descriptor has llm.c's layout (gpt2): a header of 256 little-endian int32 (h[0] = 20240326,
//                  h[1] = 3 for FP32 or 5 for BF16, h[2..7] = maxT, V, L, NH, C, Vp), then 16 tensors stacked over the
//                  layers in one flat blob: wte (Vp, C), wpe (maxT, C),
//                  ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C),
//                  ln2w (L, C), ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C),
//                  lnfw (C), lnfb (C). llm.c's matrices are nn.Linear (out, in) like ours and its qkv rows are
//                  q | k | v like ours, so nothing is transposed: the per-layer tensors are only stacked. The
//                  vocabulary is padded to Vp with zero rows, as llm.c's writer does (rows past V are written and
//                  read as zeros).
//
// Round trips are exact: export -> import -> export gives the same bytes (both formats, F32 and BF16). A BF16 export
// of FP32 weights rounds them once (round to nearest even); importing gives those rounded values exactly, and exporting
// them again gives the same BF16 bytes. An F32 export of FP32 weights is lossless.
//
// Every problem (unknown architecture, missing / unexpected tensor, wrong shape or dtype, bad magic, truncated file,
// a config that describes another model) is an llmc::Error that names the file and, where there is one, the tensor or
// the config key.
#pragma once

#include <string>
#include <vector>

#include "llmc/model/model_spec.h"

namespace llmc {


enum class WeightDtype { F32, BF16 };
// "float32" / "fp32" / "f32" and "bfloat16" / "bf16"; anything else is an llmc::Error listing the choices.
WeightDtype parse_weight_dtype(const std::string& name);
const char* weight_dtype_name(WeightDtype dtype);  // "float32", "bfloat16"

// A model: its spec, its parameter table and FP32 values in the table layout.
struct ModelWeights {
  ModelSpec spec;
  ParamTable table;           // build_param_table(spec)
  std::vector<float> values;  // table.total_elements; alignment gaps and padded vocabulary rows are 0
};

// ------------------------------------------------------------------------------------------------------------------
// Hugging Face

// Writes dir/model.safetensors then dir/config.json (creating dir if needed; both files are written atomically).
// gpt2 -> GPT2LMHeadModel (gelu_new, no dropout, lm_head tied); llama -> LlamaForCausalLM (silu, plain RoPE with
// rope_theta, no biases, tie_word_embeddings as the spec; an untied lm_head.weight is exported unpadded).
// values: table.total_elements floats for build_param_table(spec). Returns the paths written.
std::vector<std::string> export_hf(const std::string& dir, const ModelSpec& spec, const float* values,
                                   WeightDtype dtype);

// Reads a Hugging Face model directory. The spec comes from config.json; padded_vocab_size = vocab_size rounded up to
// padded_vocab_multiple (the added rows are 0).
ModelWeights import_hf(const std::string& dir, int padded_vocab_multiple = 128);

// The Hugging Face name and shape of one of our tensors, and whether the data is transposed on the way (GPT-2 Conv1D).
struct HfTensorMapping {
  std::string hf_name;
  std::vector<int64_t> hf_shape;
  bool transposed = false;   // our (out, in) <-> Hugging Face (in, out)
  bool vocab_rows = false;   // rows are the vocabulary: only the first spec.vocab_size rows exist on the HF side
};
HfTensorMapping hf_mapping(const ModelSpec& spec, const ParamInfo& p);

// ------------------------------------------------------------------------------------------------------------------
// llm.c model files (GPT-2 only)

constexpr int kLlmcModelMagic = 20240326;
constexpr int kLlmcVersionF32 = 3;
constexpr int kLlmcVersionBF16 = 5;

// Writes the file atomically (path + ".tmp", fsync, rename). llmc::Error for a spec llm.c cannot represent
// (not gpt2, ffn_hidden != 4 * n_embd, norm_eps != 1e-5, untied embeddings).
void export_llmc(const std::string& path, const ModelSpec& spec, const float* values, WeightDtype dtype);
// Reads version 3 (FP32) or 5 (BF16). The spec comes from the header (Vp included).
ModelWeights import_llmc(const std::string& path);

// ------------------------------------------------------------------------------------------------------------------
// Weights for a run (train.init_from, export)

enum class WeightsFormat { Llm8, HuggingFace, Llmc };
// What a path holds: a directory with config.json (Hugging Face), a file starting with the llm.c model magic (llm.c),
// otherwise our own checkpoint step directory or model.safetensors file (Llm8). llmc::Error if the path does not exist.
WeightsFormat detect_weights_format(const std::string& path);

// Loads weights for spec into values (build_param_table(spec).total_elements floats): from our checkpoint step
// directory or model.safetensors (every tensor of the table by name, F32, the table's shape), a Hugging Face directory
// or an llm.c model file. For the last two the imported model must be the one the config describes: every
// model.* key (arch, n_layer, n_head, n_kv_head, n_embd, vocab_size, max_seq_len, ffn_hidden, norm_eps, ...) must
// match, or an llmc::Error names the key with both values; the vocabulary padding is re-done for spec. Returns a
// one-line description of the source ("Hugging Face directory d (gpt2)").
std::string load_weights(const std::string& path, const ModelSpec& spec, float* values);

// Checks, before anything is read or written, that spec can be exported: as a Hugging Face config (any dtype), and as
// an llm.c model file when llmc_path is set (GPT-2 only). llmc::Error naming the problem otherwise.
void check_exportable(const ModelSpec& spec, const std::string& llmc_path, WeightDtype dtype);

}  // namespace llmc
