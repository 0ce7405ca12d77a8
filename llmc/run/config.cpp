// llmc/run/config.cpp: the run-config schema and everything it drives. One table (kSchema below: section, key, type, help,
// allowed range, accessors into RunConfig) is the single source for JSON loading, `--set` overrides, type and range
// validation, defaults (read from the structs in config.h), config_to_json and config_key_docs. Presets and the checks
// that span several keys (batch divisibility, context length, head size...) follow the table.
#include "llmc/run/config.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>

#include "llmc/core/common.h"
#include "llmc/core/input_safety.h"
#include "llmc/precision/quantize.h"
#include "llmc/model/family.h"

namespace llmc {

using nlohmann::json;

namespace {

constexpr uint64_t kMaxConfigFileBytes = 16u << 20;  // a run config is a few KB; anything near this is not one

enum class KeyType { Int, Int64, Float, Bool, String, IntList };

const char* type_doc_name(KeyType t) {
  switch (t) {
    case KeyType::Int:
    case KeyType::Int64: return "int";
    case KeyType::Float: return "float";
    case KeyType::Bool: return "bool";
    case KeyType::String: return "string";
    case KeyType::IntList: return "int list";
  }
  return "?";
}

const char* type_expected_name(KeyType t) {
  switch (t) {
    case KeyType::Int:
    case KeyType::Int64: return "an integer";
    case KeyType::Float: return "a number";
    case KeyType::Bool: return "a boolean (true or false)";
    case KeyType::String: return "a string";
    case KeyType::IntList: return "a list of integers, e.g. [0, -1]";
  }
  return "?";
}

constexpr double kInf = std::numeric_limits<double>::infinity();

struct KeySchema {
  const char* section;
  const char* key;
  KeyType type;
  const char* help;
  // Numeric range [lo, hi] (open ends where lo_open / hi_open); ignored for strings and booleans.
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  std::vector<std::string> choices;  // allowed strings; empty = any
  const char* doc_default = nullptr;  // shown instead of the struct default where the default is derived
  std::function<json(const RunConfig&)> get;
  std::function<void(RunConfig&, const json&)> set;

  std::string full_name() const { return std::string(section) + "." + key; }
};

// Floats print as the shortest decimal that reads back to the same float (1e-05, not 9.99999974737875e-06).
json float_to_json(float v) {
  char buf[32];
  for (int precision = 6; precision <= 9; precision++) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, static_cast<double>(v));
    if (static_cast<float>(std::strtod(buf, nullptr)) == v) break;
  }
  return json(std::strtod(buf, nullptr));
}

// A number for a key stored as a 32-bit float: an llmc::Error naming the key when it would become inf or 0.
float json_to_float(const json& v, const char* key) {
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > FLT_MAX)
    throw_error("%s = %s does not fit the key's 32-bit float (at most %g)", key, v.dump().c_str(),
                static_cast<double>(FLT_MAX));
  const float f = static_cast<float>(d);
  if (d != 0 && f == 0)
    throw_error("%s = %s is too small for the key's 32-bit float (it would be 0; at least %g)", key,
                v.dump().c_str(), static_cast<double>(FLT_TRUE_MIN));
  return f;
}

// Builders for the table rows. `member` is an expression on `c` (a RunConfig) naming the field.
#define LLMC_ACCESS(member)                                                     \
  [](const RunConfig& c) { return json(c.member); },                            \
  [](RunConfig& c, const json& v) { c.member = v.get<decltype(c.member)>(); }
// The element format and the block shape of a role's encoding (llmc/precision/encoding.h), stored as their names (the
// choices of the row are configurable_element_formats / configurable_block_shapes, llmc/precision/recipe.h); the
// scale format follows from them (role_encoding: FP8 keeps its FP32 / power-of-two scales, E2M1 takes NVFP4's or
// MXFP4's by its block), so the keys may be set in any order.
#define ELEMENT_ACCESS(encoding)                                                                        \
  [](const RunConfig& c) { return json(element_format_name(c.encoding.element)); },                    \
  [](RunConfig& c, const json& v) {                                                                     \
    ElementFormat f = c.encoding.element;                                                                \
    parse_element_format(v.get<std::string>(), &f);                                                      \
    c.encoding = role_encoding(f, c.encoding.block, c.encoding.scale == ScaleFormat::Pow2FP32);          \
  }
#define BLOCK_ACCESS(encoding)                                                                          \
  [](const RunConfig& c) { return json(block_shape_name(c.encoding.block)); },                         \
  [](RunConfig& c, const json& v) {                                                                     \
    BlockShape b = c.encoding.block;                                                                     \
    parse_block_shape(v.get<std::string>(), &b);                                                         \
    c.encoding = role_encoding(c.encoding.element, b, c.encoding.scale == ScaleFormat::Pow2FP32);        \
  }

std::vector<std::string> configurable_element_names() {
  std::vector<std::string> names;
  for (ElementFormat f : configurable_element_formats()) names.push_back(element_format_name(f));
  return names;
}
std::vector<std::string> configurable_block_names() {
  std::vector<std::string> names;
  for (BlockShape b : configurable_block_shapes()) names.push_back(block_shape_name(b));
  return names;
}

KeySchema row(const char* section, const char* key, KeyType type, const char* help,
              std::function<json(const RunConfig&)> get, std::function<void(RunConfig&, const json&)> set) {
  KeySchema k;
  k.section = section;
  k.key = key;
  k.type = type;
  k.help = help;
  k.get = std::move(get);
  k.set = std::move(set);
  return k;
}
KeySchema at_least(KeySchema k, double lo) { k.lo = lo; return k; }
KeySchema above(KeySchema k, double lo) { k.lo = lo; k.lo_open = true; return k; }
KeySchema between(KeySchema k, double lo, double hi) { k.lo = lo; k.hi = hi; return k; }
KeySchema open_unit(KeySchema k) { k.lo = 0; k.hi = 1; k.lo_open = k.hi_open = true; return k; }
KeySchema one_of(KeySchema k, std::vector<std::string> choices) { k.choices = std::move(choices); return k; }
KeySchema derived_default(KeySchema k, const char* doc) { k.doc_default = doc; return k; }

static_assert(size_limits::kMicroBatchTokens == 16777216 && size_limits::kGradAccumSteps == 16777216,
              "the help of train.micro_batch and train.global_batch_tokens quotes these limits");

const std::vector<KeySchema>& schema() {
  using T = KeyType;
  static const std::string recipe_help =
      "precision recipe preset: " + precision_recipe_summaries() + "; the keys below override its fields";
  static const std::vector<std::string> formats = configurable_element_names(), blocks = configurable_block_names();
  namespace L = size_limits;
  static const std::vector<KeySchema> table = {
      // model: a preset fills every key; explicit keys override it. Without a preset the defaults are gpt2-124m's.
      row("model", "preset", T::String, "model preset (gpt2-tiny, gpt2-mini, gpt2-124m, gpt2-350m, gpt2-774m, "
          "gpt2-1558m, llama-tiny, llama-125m, llama-350m, llama-1b, llama-3b, llama-7b); \"\" = none, the keys below define "
          "the model", LLMC_ACCESS(model_preset)),
      row("model", "arch", T::String, "architecture: gpt2 | llama", LLMC_ACCESS(model.arch)),
      between(row("model", "n_layer", T::Int, "transformer blocks (L)", LLMC_ACCESS(model.n_layer)), 1, L::kLayers),
      between(row("model", "n_head", T::Int, "attention heads (H)", LLMC_ACCESS(model.n_head)), 1, L::kHeads),
      derived_default(between(row("model", "n_kv_head", T::Int, "key/value heads: divides n_head (grouped-query "
                                  "attention, llama); must equal n_head for gpt2",
                                  LLMC_ACCESS(model.n_kv_head)), 1, L::kHeads), "n_head"),
      between(row("model", "n_embd", T::Int, "embedding width (C)", LLMC_ACCESS(model.n_embd)), 1, L::kEmbd),
      between(row("model", "vocab_size", T::Int, "real vocabulary size (V)", LLMC_ACCESS(model.vocab_size)), 1,
              L::kVocab),
      between(row("model", "padded_vocab_multiple", T::Int,
                  "the embedding/lm_head rows are V rounded up to a multiple of this (Vp)",
                  LLMC_ACCESS(padded_vocab_multiple)), 1, L::kPaddedVocabMultiple),
      between(row("model", "max_seq_len", T::Int, "context length (gpt2: rows of wpe; llama: longest sequence)",
                  LLMC_ACCESS(model.max_seq_len)), 1, L::kSeqLen),
      derived_default(between(row("model", "ffn_hidden", T::Int, "MLP hidden size (F; llama: the width of gate_proj "
                                  "and up_proj, a multiple of 8)", LLMC_ACCESS(model.ffn_hidden)), 1, L::kFfnHidden),
                      "gpt2: 4 * n_embd; llama: 8 * n_embd / 3 rounded up to a multiple of 256"),
      above(row("model", "norm_eps", T::Float, "LayerNorm (gpt2) / RMSNorm (llama) epsilon",
                [](const RunConfig& c) { return float_to_json(c.model.norm_eps); },
                [](RunConfig& c, const json& v) { c.model.norm_eps = json_to_float(v, "model.norm_eps"); }), 0),
      above(row("model", "rope_theta", T::Float, "llama: RoPE base theta (Llama 3: 500000); unused by gpt2",
                [](const RunConfig& c) { return float_to_json(c.model.rope_theta); },
                [](RunConfig& c, const json& v) { c.model.rope_theta = json_to_float(v, "model.rope_theta"); }), 0),
      row("model", "tied_embeddings", T::Bool, "the lm_head shares the token embedding matrix (gpt2: must be true; "
          "llama: false adds lm_head.weight)", LLMC_ACCESS(model.tied_embeddings)),

      row("data", "train", T::String, "glob of training shards, e.g. data/kjv/kjv_train_*.bin (required)",
          LLMC_ACCESS(data.train)),
      row("data", "val", T::String, "glob of validation shards (\"\" = no validation)", LLMC_ACCESS(data.val)),
      row("data", "shuffle", T::Bool, "shuffle the order of sequences (per epoch, seeded)", LLMC_ACCESS(data.shuffle)),
      at_least(row("data", "seed", T::Int, "data shuffling seed", LLMC_ACCESS(data.seed)), 0),
      row("data", "tokenizer", T::String, "GPT-2 vocabulary (encoder.json) used to decode samples",
          LLMC_ACCESS(data.tokenizer)),
      row("data", "check_tokens", T::Bool, "before the first step, check every token of every shard against "
          "model.vocab_size (multithreaded, the ranks share the work); false skips that scan for very large datasets "
          "(every batch read is still checked)", LLMC_ACCESS(data.check_tokens)),

      between(row("train", "micro_batch", T::Int, "sequences per GPU per micro-step (B); micro_batch * seq_len is "
                  "at most 16777216 tokens", LLMC_ACCESS(train.micro_batch)), 1, L::kMicroBatch),
      between(row("train", "seq_len", T::Int, "tokens per sequence (T), at most model.max_seq_len",
                  LLMC_ACCESS(train.seq_len)), 1, L::kSeqLen),
      between(row("train", "global_batch_tokens", T::Int64,
                  "tokens per optimizer step over all GPUs: a multiple of micro_batch * seq_len * world_size, at "
                  "most 16777216 times it (0 = exactly that: no gradient accumulation)",
                  LLMC_ACCESS(train.global_batch_tokens)), 0, L::kGlobalBatchTokens),
      between(row("train", "steps", T::Int, "optimizer steps", LLMC_ACCESS(train.steps)), 1, L::kSteps),
      above(row("train", "lr", T::Float, "peak learning rate", LLMC_ACCESS(train.lr)), 0),
      between(row("train", "warmup_steps", T::Int, "linear warm-up steps (at most train.steps)",
                  LLMC_ACCESS(train.warmup_steps)), 0, L::kSteps),
      one_of(row("train", "schedule", T::String, "learning-rate decay after warm-up", LLMC_ACCESS(train.schedule)),
             {"cosine", "linear", "constant", "wsd"}),
      between(row("train", "final_lr_frac", T::Float, "lr at the end of decay, as a fraction of lr",
                  LLMC_ACCESS(train.final_lr_frac)), 0, 1),
      between(row("train", "wsd_decay_frac", T::Float, "wsd: fraction of the steps spent decaying at the end",
                  LLMC_ACCESS(train.wsd_decay_frac)), 0, 1),
      at_least(row("train", "grad_clip", T::Float, "global gradient-norm clip (0 = off)", LLMC_ACCESS(train.grad_clip)),
               0),
      at_least(row("train", "seed", T::Int, "parameter initialisation seed", LLMC_ACCESS(train.seed)), 0),
      between(row("train", "recompute", T::Int,
                  "0 = keep all activations; 1 = recompute the norm outputs (LayerNorm / RMSNorm) and the "
                  "GELU / SwiGLU outputs in backward",
                  LLMC_ACCESS(train.recompute)), 0, 1),
      row("train", "deterministic", T::Bool, "bit-identical runs (deterministic kernels and GEMM algorithms)",
          LLMC_ACCESS(train.deterministic)),
      row("train", "init_from", T::String,
          "\"\" = random init; else weights to start from: an llm8 checkpoint step directory or model.safetensors, a "
          "Hugging Face model directory (config.json + model.safetensors) or an llm.c model .bin; the model section "
          "must describe that model", LLMC_ACCESS(train.init_from)),
      between(row("train", "max_skipped_steps", T::Int,
                  "divergence guard: a step whose loss or gradient norm is not finite is skipped (no update); stop "
                  "after this many consecutive skips", LLMC_ACCESS(train.max_skipped_steps)), 1, L::kSteps),
      row("train", "allow_nonfinite_init", T::Bool,
          "load train.init_from weights that hold NaN or Inf (by default such weights are refused, naming the tensor "
          "and the element)", LLMC_ACCESS(train.allow_nonfinite_init)),

      one_of(row("optimizer", "type", T::String, "optimizer", LLMC_ACCESS(optimizer.type)), {"adamw"}),
      open_unit(row("optimizer", "beta1", T::Float, "AdamW first-moment decay", LLMC_ACCESS(optimizer.beta1))),
      open_unit(row("optimizer", "beta2", T::Float, "AdamW second-moment decay", LLMC_ACCESS(optimizer.beta2))),
      above(row("optimizer", "eps", T::Float, "AdamW epsilon", LLMC_ACCESS(optimizer.eps)), 0),
      at_least(row("optimizer", "weight_decay", T::Float, "decoupled weight decay, applied to 2-D tensors only",
                   LLMC_ACCESS(optimizer.weight_decay)), 0),
      one_of(row("optimizer", "state_format", T::String,
                 "storage of the AdamW moments m and v (bf16: rounded to nearest even after every update; fp8: E4M3 "
                 "in groups of 128 with one FP32 scale each, 2.06 B/param for m+v; fp8_expand: COAT's dynamic range "
                 "expansion, scale, exponent and centre per group, 2.19 B/param; the update and the master weights "
                 "stay FP32); a checkpoint of another format is converted on resume",
                 [](const RunConfig& c) { return json(c.optimizer.state_format.name); },
                 [](RunConfig& c, const json& v) {
                   c.optimizer.state_format = parse_state_format(v.get<std::string>());
                 }),
             state_format_names()),

      // precision: the preset named in precision.recipe fills every key below; explicit keys override it.
      row("precision", "recipe", T::String, recipe_help.c_str(), LLMC_ACCESS(precision.recipe)),
      one_of(row("precision", "x_format", T::String,
                 "element format of linear inputs (e2m1 = FP4: 1x16 / 16x16 blocks give NVFP4 scales, 1x32 MXFP4)",
                 ELEMENT_ACCESS(precision.x)),
             formats),
      one_of(row("precision", "w_format", T::String, "element format of weights", ELEMENT_ACCESS(precision.w)), formats),
      one_of(row("precision", "dy_format", T::String, "element format of output gradients", ELEMENT_ACCESS(precision.dy)),
             formats),
      one_of(row("precision", "x_granularity", T::String, "scaling granularity of linear inputs",
                 BLOCK_ACCESS(precision.x)), blocks),
      one_of(row("precision", "w_granularity", T::String, "scaling granularity of weights", BLOCK_ACCESS(precision.w)),
             blocks),
      one_of(row("precision", "dy_granularity", T::String, "scaling granularity of output gradients",
                 BLOCK_ACCESS(precision.dy)), blocks),
      one_of(row("precision", "scaling", T::String,
                 "per-tensor scales from the current amax or delayed from an amax history",
                 [](const RunConfig& c) { return json(scaling_mode_name(c.precision.scaling)); },
                 [](RunConfig& c, const json& v) {
                   c.precision.scaling = v.get<std::string>() == "delayed" ? ScalingMode::Delayed : ScalingMode::Current;
                 }), {"current", "delayed"}),
      between(row("precision", "amax_history_len", T::Int, "delayed scaling: steps of amax history",
                  LLMC_ACCESS(precision.amax_history_len)), 1, L::kCount),
      one_of(row("precision", "amax_compute", T::String, "delayed scaling: scale from the max of the history or the "
                 "most recent amax", LLMC_ACCESS(precision.amax_compute)), {"max", "most_recent"}),
      between(row("precision", "margin", T::Int, "scale = fp8_max / amax / 2^margin", LLMC_ACCESS(precision.margin)),
              0, 16),
      row("precision", "pow2_scales", T::Bool, "round scales down to powers of two",
          [](const RunConfig& c) { return json(c.precision.pow2_scales()); },
          [](RunConfig& c, const json& v) { c.precision.set_pow2_scales(v.get<bool>()); }),
      row("precision", "fast_accum", T::Bool,
          "fast FP8 accumulation in the forward GEMM (per-tensor scales only; dgrad and wgrad never use it)",
          LLMC_ACCESS(precision.fast_accum)),
      row("precision", "tensorwise_products", T::String,
          "products of the block-scaled recipes run with one FP32 scale per operand tensor instead (current scaling, "
          "same element formats): a comma-separated subset of fprop, dgrad, wgrad, e.g. \"dgrad,wgrad\" keeps blocks "
          "in fprop only (\"\" = none; the per-product ablation of fp8_blockwise)",
          [](const RunConfig& c) { return json(format_linear_products(c.precision.tensorwise_products)); },
          [](RunConfig& c, const json& v) {
            std::string why;
            if (!parse_linear_products(v.get<std::string>(), &c.precision.tensorwise_products, &why))
              throw_error("precision.tensorwise_products = \"%s\": %s; use a comma-separated subset of fprop, dgrad, "
                          "wgrad, or \"\"", v.get<std::string>().c_str(), why.c_str());
          }),
      row("precision", "bf16_layers", T::IntList, "blocks that stay in BF16, e.g. [0, -1] (negative = from the end)",
          LLMC_ACCESS(precision.bf16_layers)),
      row("precision", "lm_head_fp8", T::Bool, "run the lm_head GEMMs quantised too (embeddings always stay BF16)",
          LLMC_ACCESS(precision.quantize_lm_head)),
      row("precision", "fp8_activations", T::Bool,
          "save linear inputs for backward quantised (their transposed FP8 / FP4 copies) instead of BF16",
          LLMC_ACCESS(precision.save_quantized_inputs)),
      row("precision", "cache_weight_transpose", T::Bool,
          "keep each FP8 weight's transposed codes for the optimizer step (false: transpose them in every backward, "
          "1 byte less per FP8 parameter, one more pass over the weights per micro-step; the coat preset sets "
          "false)",
          LLMC_ACCESS(precision.cache_weight_transpose)),
      row("precision", "cache_weights", T::Bool,
          "keep each FP8 weight's codes for the optimizer step (false: quantise the weight into scratch shared by "
          "all linears in every forward and again in every backward, the same codes: no per-parameter weight cache, "
          "two more casts of the weights per micro-step; FP8 weights only; the coat preset sets false)",
          LLMC_ACCESS(precision.cache_weights)),
      one_of(row("precision", "dy_rounding", T::String,
                 "rounding of the output gradients' codes: nearest (ties to even) or stochastic (FP4 only; random "
                 "bits keyed by train.seed, step, micro-step and tensor, so runs repeat and resume bit for bit)",
                 [](const RunConfig& c) { return json(c.precision.dy_stochastic_rounding ? "stochastic" : "nearest"); },
                 [](RunConfig& c, const json& v) {
                   c.precision.dy_stochastic_rounding = v.get<std::string>() == "stochastic";
                 }), {"nearest", "stochastic"}),
      row("precision", "nonlinear_fp8", T::Bool,
          "COAT's FP8 activations: keep the inputs that the norms (LayerNorm / RMSNorm) and GELU / SwiGLU save for "
          "backward as E4M3 with one FP32 scale per 16 channels instead of BF16 (the forward, the residual stream, "
          "attention and the linear inputs are unchanged; needs train.recompute 0 and model widths that are "
          "multiples of 16)", LLMC_ACCESS(precision.nonlinear_fp8)),
      row("precision", "recompute_mlp_act", T::Bool,
          "COAT's FP8 flow for the MLP activation (needs nonlinear_fp8): GELU / SwiGLU compute their output from "
          "the FP8 copy of their input, and backward recomputes that output (the c_proj / down_proj input, "
          "bit for bit) instead of keeping a copy for wgrad: ffn_hidden bytes (FP8) less per token and block; the "
          "forward's values change by the copy's rounding (the coat preset sets it)",
          LLMC_ACCESS(precision.recompute_mlp_act)),
      between(row("precision", "wgrad_hadamard", T::Int,
                  "size of the random Hadamard transform applied along the tokens to both weight-gradient operands "
                  "(dy and x; FP4 1xN blocks only; one sign vector per run, from train.seed): 0 (none), 16 or 32",
                  LLMC_ACCESS(precision.wgrad_hadamard)), 0, 32),
      one_of(row("precision", "backward_scale", T::String,
                 "MXFP4 backward: absmax (the dy, x, w copies quantised from BF16 with the OCP amax rule) or "
                 "range_matched (Quartet: the forward's saved FP4 codes and dy re-quantised with E8M0 = "
                 "2^(floor(log2 amax) - 2), elements x 3/4, products x 16/9; precision.dy_rounding rounds all of them)",
                 [](const RunConfig& c) {
                   return json(c.precision.backward_range_matched ? "range_matched" : "absmax");
                 },
                 [](RunConfig& c, const json& v) {
                   c.precision.backward_range_matched = v.get<std::string>() == "range_matched";
                 }), {"absmax", "range_matched"}),
      between(row("precision", "forward_hadamard", T::Int,
                  "Quartet forward: size of the fixed Hadamard transform of x and w along K (0 = none, or 32; needs "
                  "backward_scale = range_matched)", LLMC_ACCESS(precision.forward_hadamard)), 0, 32),
      one_of(row("precision", "forward_signs", T::String,
                 "Quartet forward: none (the rotation is H32, as Quartet's) or random (H32 times one random sign "
                 "vector for the run, drawn from train.seed, on x and w alike; the backward undoes the same rotation; "
                 "needs forward_hadamard = 32)",
                 [](const RunConfig& c) { return json(c.precision.forward_random_signs ? "random" : "none"); },
                 [](RunConfig& c, const json& v) {
                   c.precision.forward_random_signs = v.get<std::string>() == "random";
                 }), {"none", "random"}),
      one_of(row("precision", "forward_scale", T::String,
                 "Quartet forward: E8M0 scales of x and w from the block amax (absmax) or QuEST's block standard "
                 "deviation (gaussian, clips beyond about 2.92 sigma; needs backward_scale = range_matched)",
                 [](const RunConfig& c) { return json(c.precision.forward_gaussian_scales ? "gaussian" : "absmax"); },
                 [](RunConfig& c, const json& v) {
                   c.precision.forward_gaussian_scales = v.get<std::string>() == "gaussian";
                 }), {"absmax", "gaussian"}),
      row("precision", "trust_mask", T::Bool,
          "Quartet forward: keep QuEST's 1-bit trust masks of x and w and pass gradients only where the element was "
          "not clipped (needs backward_scale = range_matched)", LLMC_ACCESS(precision.trust_mask)),
      between(row("precision", "backward_hadamard", T::Int,
                  "Quartet backward: size of the Hadamard transform with fresh random signs per micro-step (keyed by "
                  "train.seed, step, micro-step and layer) applied to both operands of dgrad (along N) and wgrad "
                  "(along the tokens): 0 (none) or 32 (needs backward_scale = range_matched)",
                  LLMC_ACCESS(precision.backward_hadamard)), 0, 32),

      one_of(row("parallel", "init", T::String, "how ranks find each other: auto | mpi | tcp | fs | none",
                 LLMC_ACCESS(parallel.init)), {"auto", "mpi", "tcp", "fs", "none"}),
      between(row("parallel", "zero_stage", T::Int, "0 = replicate optimizer state, 1 = shard it (ZeRO-1)",
                  LLMC_ACCESS(parallel.zero_stage)), 0, 1),
      row("parallel", "fs_path", T::String, "shared directory for the fs init method", LLMC_ACCESS(parallel.fs_path)),
      at_least(row("parallel", "timeout_s", T::Int, "seconds to wait for peers before failing",
                   LLMC_ACCESS(parallel.timeout_s)), 1),

      row("checkpoint", "dir", T::String, "run directory (\"\" = no checkpoints)", LLMC_ACCESS(checkpoint.dir)),
      between(row("checkpoint", "every", T::Int, "checkpoint every N steps (0 = only at the end when dir is set)",
                  LLMC_ACCESS(checkpoint.every)), 0, L::kSteps),
      between(row("checkpoint", "keep", T::Int, "keep the newest N complete checkpoints (0 = keep all)",
                  LLMC_ACCESS(checkpoint.keep)), 0, L::kCount),
      row("checkpoint", "resume", T::String,
          "auto = newest complete checkpoint in dir if any | none | path to a step directory",
          LLMC_ACCESS(checkpoint.resume)),
      row("checkpoint", "overwrite", T::Bool,
          "a new run (resume none, or a step directory from elsewhere) in a dir that holds checkpoints moves them into "
          "dir/abandoned/<time>/ (kept, never deleted) and starts over; false = stop with an error before training",
          LLMC_ACCESS(checkpoint.overwrite)),

      between(row("eval", "every", T::Int, "validation loss every N steps (0 = off; also at the end if data.val is set)",
                  LLMC_ACCESS(eval.every)), 0, L::kSteps),
      between(row("eval", "batches", T::Int, "micro-batches per validation", LLMC_ACCESS(eval.batches)), 1,
              L::kCount),

      between(row("sample", "every", T::Int, "sample every N steps (0 = only at the end)", LLMC_ACCESS(sample.every)),
              0, L::kSteps),
      between(row("sample", "tokens", T::Int, "tokens to generate (0 = no sampling)", LLMC_ACCESS(sample.tokens)), 0,
              L::kCount),
      above(row("sample", "temperature", T::Float, "softmax temperature", LLMC_ACCESS(sample.temperature)), 0),
      between(row("sample", "top_k", T::Int, "sample from the k most likely tokens (0 = full distribution)",
                  LLMC_ACCESS(sample.top_k)), 0, L::kVocab),
      at_least(row("sample", "seed", T::Int, "sampling seed (sampling starts from <|endoftext|>)",
                   LLMC_ACCESS(sample.seed)), 0),

      between(row("log", "every", T::Int, "console line every N steps", LLMC_ACCESS(log.every)), 1, L::kSteps),
      row("log", "jsonl", T::String, "JSONL metrics file (\"\" = <checkpoint.dir>/metrics.jsonl when dir is set)",
          LLMC_ACCESS(log.jsonl)),
      between(row("log", "numerics_every", T::Int,
                  "numerics telemetry (amax, scale, saturated, clipped and underflow fractions, SNR of every "
                  "quantised tensor; clipped_frac: elements whose scaled value is beyond the format's largest finite "
                  "value or NaN, FP8 above 448 / 57344, E2M1 at or above 6, the complement of QuEST's trust mask) "
                  "every N steps into the JSONL log (0 = off)", LLMC_ACCESS(log.numerics_every)), 0, L::kSteps),
      row("log", "numerics_products", T::Bool,
          "on numerics_every's steps also measure every quantised product (fprop, dgrad, wgrad) against the BF16 "
          "product of the unquantised operands: its SNR in \"product_numerics\" records (one BF16 GEMM more per "
          "product and the output's size in temporary memory; wgrad only where backward has the BF16 input, e.g. "
          "with precision.fp8_activations = false)", LLMC_ACCESS(log.numerics_products)),
  };
  return table;
}
#undef LLMC_ACCESS
#undef FORMAT_ACCESS
#undef GRANULARITY_ACCESS

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {"model",     "data",     "train",      "optimizer", "precision",
                                                 "parallel",  "checkpoint", "eval",     "sample",    "log"};
  return names;
}

const KeySchema* find_key(const std::string& section, const std::string& key) {
  for (const KeySchema& k : schema())
    if (section == k.section && key == k.key) return &k;
  return nullptr;
}

bool is_section(const std::string& s) {
  return std::find(section_names().begin(), section_names().end(), s) != section_names().end();
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) prev[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); i++) out += (i ? sep : "") + items[i];
  return out;
}

// " (did you mean 'optimizer.beta1'?)" for an unknown key, searching every section (a key in the right place but the
// wrong section costs 1), or the list of the section's keys when nothing is close.
std::string suggest_key(const std::string& section, const std::string& key) {
  const KeySchema* best = nullptr;
  size_t best_score = std::numeric_limits<size_t>::max();
  for (const KeySchema& k : schema()) {
    size_t score = edit_distance(key, k.key) + (section == k.section ? 0 : 1);
    if (score < best_score) {
      best_score = score;
      best = &k;
    }
  }
  size_t tolerance = std::max<size_t>(2, key.size() / 3);
  if (best && best_score <= tolerance) return " (did you mean '" + best->full_name() + "'?)";
  std::vector<std::string> keys;
  for (const KeySchema& k : schema())
    if (section == k.section) keys.push_back(k.key);
  return " (valid keys in '" + section + "': " + join(keys, ", ") + "; run train_gpt --list-keys)";
}

std::string suggest_section(const std::string& section) {
  std::string best;
  size_t best_score = std::numeric_limits<size_t>::max();
  for (const std::string& s : section_names()) {
    size_t score = edit_distance(section, s);
    if (score < best_score) {
      best_score = score;
      best = s;
    }
  }
  // A key written at the top level ("lr": ...) belongs in a section.
  for (const KeySchema& k : schema())
    if (section == k.key) return " (did you mean '" + k.full_name() + "'? keys go inside their section)";
  if (best_score <= std::max<size_t>(2, section.size() / 3)) return " (did you mean '" + best + "'?)";
  return " (sections: " + join(section_names(), ", ") + ")";
}

[[noreturn]] void unknown_key(const std::string& section, const std::string& key) {
  throw_error("unknown key '%s.%s'%s", section.c_str(), key.c_str(), suggest_key(section, key).c_str());
}

[[noreturn]] void unknown_section(const std::string& section) {
  throw_error("unknown section '%s'%s", section.c_str(), suggest_section(section).c_str());
}

std::string describe_value(const json& v) {
  if (v.is_number_float() && !std::isfinite(v.get<double>()))  // dump() would say null
    return strformat("number %g", v.get<double>());
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + text;
}

// Type check of one JSON value against its key; throws naming the key with expected vs got.
void check_type(const KeySchema& k, const json& v) {
  bool ok = false;
  switch (k.type) {
    case KeyType::Int:
    case KeyType::Int64: {
      ok = v.is_number_integer();
      if (!ok && v.is_number_float()) {  // accept 1e4 or 8.0, but not 8.5
        double d = v.get<double>();
        ok = std::isfinite(d) && d == std::floor(d);
      }
      if (ok) {
        double d = v.get<double>();
        double lim = k.type == KeyType::Int ? static_cast<double>(std::numeric_limits<int>::max()) : 9.0e18;
        if (d > lim || d < -lim)
          throw_error("%s: %s is out of range for an integer key", k.full_name().c_str(), v.dump().c_str());
      }
      break;
    }
    case KeyType::Float:
      ok = v.is_number();
      if (ok && !std::isfinite(v.get<double>()))
        throw_error("%s: %g is not a finite number", k.full_name().c_str(), v.get<double>());
      break;
    case KeyType::Bool: ok = v.is_boolean(); break;
    case KeyType::String: ok = v.is_string(); break;
    case KeyType::IntList:
      ok = v.is_array() && std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number_integer(); });
      if (ok)
        for (const json& e : v)
          if (e.get<double>() > std::numeric_limits<int>::max() || e.get<double>() < std::numeric_limits<int>::min())
            throw_error("%s: %s is out of range for an integer", k.full_name().c_str(), e.dump().c_str());
      break;
  }
  if (!ok)
    throw_error("%s: expected %s, got %s", k.full_name().c_str(), type_expected_name(k.type),
                describe_value(v).c_str());
}

void set_value(const KeySchema& k, RunConfig& cfg, const json& v) {
  check_type(k, v);
  if (!k.choices.empty() && std::find(k.choices.begin(), k.choices.end(), v.get<std::string>()) == k.choices.end())
    throw_error("%s must be one of %s (got '%s')", k.full_name().c_str(), join(k.choices, ", ").c_str(),
                v.get<std::string>().c_str());
  if ((k.type == KeyType::Int || k.type == KeyType::Int64) && v.is_number_float()) {
    k.set(cfg, json(static_cast<long long>(v.get<double>())));
  } else {
    k.set(cfg, v);
  }
}

// "section.key=value" → (section, key, JSON value). The value is parsed as JSON where the key is not a string key
// (so 3e-4, 8, true work); string keys take the text as is unless it is a quoted JSON string.
void apply_override(json& j, const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos)
    throw_error("--set '%s': expected section.key=value, e.g. --set train.lr=3e-4", text.c_str());
  std::string name = text.substr(0, eq), value_text = text.substr(eq + 1);
  size_t dot = name.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == name.size())
    throw_error("--set '%s': the key must be section.key (e.g. train.lr=3e-4), got '%s'%s", text.c_str(),
                name.c_str(), dot == std::string::npos ? suggest_section(name).c_str() : "");
  std::string section = name.substr(0, dot), key = name.substr(dot + 1);
  if (!is_section(section)) {
    try {
      unknown_section(section);
    } catch (const Error& e) {
      throw_error("--set '%s': %s", text.c_str(), e.what());
    }
  }
  const KeySchema* k = find_key(section, key);
  if (!k) {
    try {
      unknown_key(section, key);
    } catch (const Error& e) {
      throw_error("--set '%s': %s", text.c_str(), e.what());
    }
  }
  json value;
  if (k->type == KeyType::String && (value_text.empty() || value_text[0] != '"')) {
    value = value_text;
  } else {
    try {
      value = parse_json(value_text, "--set '" + text + "'");
    } catch (const JsonError& e) {
      if (e.kind != JsonError::Kind::Syntax) throw;  // too deep, a duplicate key, a number that overflows
      value = value_text;  // not JSON: a string (the type check reports it for non-strings)
    }
  }
  try {
    check_type(*k, value);
  } catch (const Error& e) {
    throw_error("--set '%s': %s", text.c_str(), e.what());
  }
  if (!j.contains(section)) j[section] = json::object();
  if (!j[section].is_object())
    throw_error("--set '%s': section '%s' of the config must be a JSON object of keys, got %s", text.c_str(),
                section.c_str(), describe_value(j[section]).c_str());
  j[section][key] = value;
}

std::string format_number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  return json(v).dump();
}

void check_range(const KeySchema& k, const RunConfig& cfg) {
  json v = k.get(cfg);
  if (!k.choices.empty()) {
    std::string s = v.get<std::string>();
    if (std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end())
      throw_error("%s must be one of %s (got '%s')", k.full_name().c_str(), join(k.choices, ", ").c_str(), s.c_str());
    return;
  }
  if (!v.is_number()) return;
  double d = v.get<double>();
  if (!std::isfinite(d)) throw_error("%s must be a finite number (got %g)", k.full_name().c_str(), d);
  bool low_ok = k.lo_open ? d > k.lo : d >= k.lo;
  bool high_ok = k.hi_open ? d < k.hi : d <= k.hi;
  if (low_ok && high_ok) return;
  std::string range;
  if (k.lo != -kInf && k.hi != kInf)
    range = std::string("in ") + (k.lo_open ? "(" : "[") + format_number(k.lo) + ", " + format_number(k.hi) +
            (k.hi_open ? ")" : "]");
  else if (k.lo != -kInf)
    range = std::string(k.lo_open ? "> " : ">= ") + format_number(k.lo);
  else
    range = std::string(k.hi_open ? "< " : "<= ") + format_number(k.hi);
  throw_error("%s must be %s (got %s)", k.full_name().c_str(), range.c_str(), v.dump().c_str());
}

std::string range_doc(const KeySchema& k) {
  if (!k.choices.empty()) return join(k.choices, " | ");
  if (k.type == KeyType::String || k.type == KeyType::Bool) return "";
  if (k.lo != -kInf && k.hi != kInf)
    return std::string(k.lo_open ? "(" : "[") + format_number(k.lo) + ", " + format_number(k.hi) +
           (k.hi_open ? ")" : "]");
  if (k.lo != -kInf) return std::string(k.lo_open ? "> " : ">= ") + format_number(k.lo);
  return "";
}

// Runs fn and prefixes any llmc::Error message with the source ("configs/x.json: ...").
template <typename Fn>
auto with_source(const std::string& source, Fn fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
}

RunConfig resolve_config(const json& input, const std::vector<std::string>& overrides, const std::string& source) {
  check_json_depth(input, source);  // before the copy below (copies recurse)
  json j = input;
  if (!j.is_object())
    throw Error(source + ": the top level must be a JSON object of sections (" + join(section_names(), ", ") +
                "), got " + j.type_name());
  for (const std::string& o : overrides) apply_override(j, o);  // errors name the --set, not the file

  return with_source(source, [&]() {
    for (auto& [section, body] : j.items()) {
      if (!is_section(section)) unknown_section(section);
      if (!body.is_object())
        throw_error("section '%s' must be a JSON object of keys, got %s", section.c_str(),
                    describe_value(body).c_str());
      for (auto& [key, value] : body.items())
        if (!find_key(section, key)) unknown_key(section, key);
    }

    RunConfig cfg;
    const json model = j.contains("model") ? j["model"] : json::object();
    // 1. The preset fills the whole model section.
    if (model.contains("preset")) {
      set_value(*find_key("model", "preset"), cfg, model["preset"]);
      if (!cfg.model_preset.empty() && !model_preset(cfg.model_preset, &cfg.model))
        throw_error("model.preset: unknown preset '%s' (known: %s)", cfg.model_preset.c_str(),
                    join(model_preset_names(), ", ").c_str());
    }
    // 1b. The recipe preset fills the whole precision section.
    const json precision = j.contains("precision") ? j["precision"] : json::object();
    if (precision.contains("recipe")) {
      const KeySchema& rk = *find_key("precision", "recipe");
      set_value(rk, cfg, precision["recipe"]);
      fill_precision_recipe(cfg.precision.recipe, &cfg.precision);
      // A preset may bring its optimizer-state format (coat: FP8 moments); an explicit optimizer.state_format wins.
      if (const char* state_format = precision_recipe_state_format(cfg.precision.recipe))
        cfg.optimizer.state_format = parse_state_format(state_format);
    }
    // 2. Explicit keys win over the presets and the defaults.
    for (const KeySchema& k : schema()) {
      if (k.section == std::string("model") && k.key == std::string("preset")) continue;
      if (k.section == std::string("precision") && k.key == std::string("recipe")) continue;
      if (j.contains(k.section) && j[k.section].contains(k.key)) set_value(k, cfg, j[k.section][k.key]);
    }
    // 3. Model sizes that follow others unless given: derived again when there is no preset or when the key they
    // follow is given (a preset's own value, e.g. llama-1b's 8 kv heads, stays otherwise).
    const bool preset = !cfg.model_preset.empty();
    if (!model.contains("n_kv_head") && (!preset || model.contains("n_head"))) cfg.model.n_kv_head = cfg.model.n_head;
    const ModelFamily* family = find_model_family(cfg.model.arch);  // null: validation names the unknown arch
    if (family && !model.contains("ffn_hidden") && (!preset || model.contains("n_embd") || model.contains("arch"))) {
      check_range(*find_key("model", "n_embd"), cfg);  // bounded, so that the width derived from it fits an int
      cfg.model.ffn_hidden = family->default_ffn_hidden(cfg.model.n_embd);
    }
    return cfg;
  });
}

}  // namespace

std::vector<std::string> recipe_names() { return precision_recipe_names(); }

void validate_config(RunConfig& cfg, int world_size) {
  with_source("config", [&]() {
    if (world_size < 1) throw_error("world size must be >= 1 (got %d)", world_size);
    ModelSpec& m = cfg.model;
    // Architecture and recipe first: their messages matter more than the numbers that follow from them.
    const ModelFamily& family = model_family(m.arch);
    validate_precision_recipe(cfg.precision, m.n_layer);  // the recipe's name, encodings and combinations
    if (!cfg.model_preset.empty() && !model_preset(cfg.model_preset, nullptr))
      throw_error("model.preset: unknown preset '%s' (known: %s)", cfg.model_preset.c_str(),
                  join(model_preset_names(), ", ").c_str());

    for (const KeySchema& k : schema()) check_range(k, cfg);

    // Model shape.
    if (m.n_embd % m.n_head != 0)
      throw_error("model.n_embd = %d is not divisible by model.n_head = %d", m.n_embd, m.n_head);
    int head_size = m.n_embd / m.n_head;
    if (head_size != 64 && head_size != 128)
      throw_error("model.n_embd / model.n_head = %d / %d = %d is not a supported head size (the attention kernels "
                  "support 64 and 128)", m.n_embd, m.n_head, head_size);
    if (m.n_head % m.n_kv_head != 0)
      throw_error("model.n_head = %d is not divisible by model.n_kv_head = %d", m.n_head, m.n_kv_head);
    family.validate(m);
    // Sizes derived from several keys are computed in checked 64-bit arithmetic and bounded in turn. Together with
    // the bounds of the keys (llmc/core/input_safety.h) they keep every size derived later (parameter counts, the
    // memory estimate's activation and logit bytes, tokens per step) far inside 64 bits.
    m.padded_vocab_size = static_cast<int>(checked_round_up(
        m.vocab_size, cfg.padded_vocab_multiple, "model.vocab_size rounded up to model.padded_vocab_multiple"));

    // Data.
    if (cfg.data.train.empty())
      throw_error("data.train is empty: set it to a glob of training shards, e.g. \"data/kjv/kjv_train_*.bin\"");
    if (cfg.eval.every > 0 && cfg.data.val.empty())
      throw_error("eval.every = %d but data.val is empty: set data.val to a glob of validation shards or eval.every "
                  "to 0", cfg.eval.every);

    // Batch and schedule.
    TrainConfig& t = cfg.train;
    if (t.seq_len > m.max_seq_len)
      throw_error("train.seq_len = %d exceeds model.max_seq_len = %d (the model's context length)", t.seq_len,
                  m.max_seq_len);
    const int64_t micro_batch_tokens = checked_mul(t.micro_batch, t.seq_len, "train.micro_batch * train.seq_len");
    if (micro_batch_tokens > size_limits::kMicroBatchTokens)
      throw_error("train.micro_batch * train.seq_len = %d * %d = %lld tokens per GPU micro-batch exceeds %lld (lower "
                  "train.micro_batch: gradient accumulation keeps train.global_batch_tokens)", t.micro_batch,
                  t.seq_len, static_cast<long long>(micro_batch_tokens),
                  static_cast<long long>(size_limits::kMicroBatchTokens));
    const long long tokens_per_micro_step =
        checked_mul(micro_batch_tokens, world_size, "train.micro_batch * train.seq_len * world_size");
    if (tokens_per_micro_step > size_limits::kGlobalBatchTokens)
      throw_error("train.micro_batch * train.seq_len * world_size = %d * %d * %d = %lld tokens per micro-step exceeds "
                  "%lld, the most train.global_batch_tokens may be", t.micro_batch, t.seq_len, world_size,
                  tokens_per_micro_step, static_cast<long long>(size_limits::kGlobalBatchTokens));
    if (t.global_batch_tokens == 0) t.global_batch_tokens = tokens_per_micro_step;
    if (t.global_batch_tokens % tokens_per_micro_step != 0)
      throw_error("train.global_batch_tokens = %lld must be a multiple of micro_batch * seq_len * world_size = "
                  "%d * %d * %d = %lld (e.g. %lld)", t.global_batch_tokens, t.micro_batch, t.seq_len, world_size,
                  tokens_per_micro_step,
                  std::max(1LL, t.global_batch_tokens / tokens_per_micro_step) * tokens_per_micro_step);
    const long long accum_steps = t.global_batch_tokens / tokens_per_micro_step;
    if (accum_steps > size_limits::kGradAccumSteps)
      throw_error("train.global_batch_tokens / (micro_batch * seq_len * world_size) = %lld / %lld = %lld accumulation "
                  "micro-steps per optimizer step, more than %lld (raise train.micro_batch or lower "
                  "train.global_batch_tokens)", t.global_batch_tokens, tokens_per_micro_step, accum_steps,
                  static_cast<long long>(size_limits::kGradAccumSteps));
    cfg.grad_accum_steps = static_cast<int>(accum_steps);
    const int multiple = quantized_dim_multiple(cfg.precision);
    if (multiple > 1) {
      // Quantised GEMMs: every dimension that is a GEMM's K (channels, and the tokens B*T for the weight gradient)
      // must be a multiple of 16, of 128 with block scales.
      const long long tokens = static_cast<long long>(t.micro_batch) * t.seq_len;
      if (tokens % multiple != 0)
        throw_error("precision.recipe = \"%s\" needs train.micro_batch * train.seq_len (%d * %d = %lld) to be a "
                    "multiple of %d (the quantised weight-gradient GEMM runs over the tokens)",
                    cfg.precision.recipe.c_str(), t.micro_batch, t.seq_len, tokens, multiple);
      if (m.n_embd % multiple != 0 || m.ffn_hidden % multiple != 0)
        throw_error("precision.recipe = \"%s\" needs model.n_embd (%d) and model.ffn_hidden (%d) to be multiples "
                    "of %d (quantised GEMM dimensions)", cfg.precision.recipe.c_str(), m.n_embd, m.ffn_hidden,
                    multiple);
    }
    if (cfg.precision.nonlinear_fp8) {
      // The FP8 copies replace the BF16 tensors that recompute would start from, and their groups are 16 channels.
      if (t.recompute != 0)
        throw_error("precision.nonlinear_fp8 (precision.recipe = \"%s\") keeps the norm and GELU / SwiGLU inputs "
                    "only as FP8 copies, from which train.recompute = 1 cannot recompute the BF16 outputs: set "
                    "train.recompute to 0 or precision.nonlinear_fp8 to false", cfg.precision.recipe.c_str());
      if (m.n_embd % kNonlinearFp8Groups.cols != 0 || m.ffn_hidden % kNonlinearFp8Groups.cols != 0)
        throw_error("precision.nonlinear_fp8 (precision.recipe = \"%s\") needs model.n_embd (%d) and "
                    "model.ffn_hidden (%d) to be multiples of %d (one FP32 scale per %d channels)",
                    cfg.precision.recipe.c_str(), m.n_embd, m.ffn_hidden, kNonlinearFp8Groups.cols,
                    kNonlinearFp8Groups.cols);
    }
    if (t.warmup_steps > t.steps)
      throw_error("train.warmup_steps = %d exceeds train.steps = %d", t.warmup_steps, t.steps);

    // Sampling, parallelism, checkpoints.
    if (cfg.sample.top_k > m.vocab_size)
      throw_error("sample.top_k = %d exceeds model.vocab_size = %d", cfg.sample.top_k, m.vocab_size);
    if (cfg.parallel.init == "fs" && cfg.parallel.fs_path.empty())
      throw_error("parallel.init is 'fs' but parallel.fs_path is empty: set it to a directory all ranks share");
    if (cfg.checkpoint.resume.empty())
      throw_error("checkpoint.resume is empty: use 'auto', 'none' or the path of a step directory");
  });
}

RunConfig load_config_json(const json& j, const std::vector<std::string>& overrides, int world_size) {
  RunConfig cfg = resolve_config(j, overrides, "config");
  validate_config(cfg, world_size);
  return cfg;
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size) {
  JsonReadOptions options;
  options.allow_comments = true;
  const json j = read_json_file(path, "config file", kMaxConfigFileBytes, options,
                                " (paths are relative to the current directory; configs/ has examples)");
  RunConfig cfg = resolve_config(j, overrides, path);
  try {
    validate_config(cfg, world_size);
  } catch (const Error& e) {  // validate_config says "config: ..."; name the file instead
    std::string what = e.what();
    if (what.rfind("config: ", 0) == 0) what = what.substr(8);
    throw Error(path + ": " + what);
  }
  return cfg;
}

json config_to_json(const RunConfig& cfg) {
  json j = json::object();
  for (const std::string& s : section_names()) j[s] = json::object();
  for (const KeySchema& k : schema()) j[k.section][k.key] = k.get(cfg);
  return j;
}

std::vector<ConfigKeyDoc> config_key_docs() {
  const RunConfig defaults;
  std::vector<ConfigKeyDoc> docs;
  for (const KeySchema& k : schema()) {
    ConfigKeyDoc d;
    d.key = k.full_name();
    d.type = type_doc_name(k.type);
    d.default_value = k.doc_default ? k.doc_default : k.get(defaults).dump();
    d.help = k.help;
    std::string range = range_doc(k);
    if (!range.empty()) d.help += " [" + range + "]";
    docs.push_back(d);
  }
  return docs;
}

ParallelConfig bootstrap_parallel_config(const std::string& config_path, const std::vector<std::string>& overrides) {
  ParallelConfig p;
  auto apply = [&p](const std::string& key, const json& v) {
    if (key == "init" && v.is_string()) p.init = v.get<std::string>();
    if (key == "fs_path" && v.is_string()) p.fs_path = v.get<std::string>();
    if (key == "timeout_s" && v.is_number_integer() && v.get<long long>() >= 1 && v.get<long long>() <= 86400 * 7)
      p.timeout_s = v.get<int>();
  };
  // Anything unreadable (a missing or non-regular file, bad JSON) leaves the defaults: load_config reports it.
  JsonReadOptions options;
  options.allow_comments = true;
  try {
    const json j = read_json_file(config_path, "config file", kMaxConfigFileBytes, options);
    if (j.is_object() && j.contains("parallel") && j["parallel"].is_object())
      for (auto it = j["parallel"].begin(); it != j["parallel"].end(); ++it) apply(it.key(), it.value());
  } catch (const Error&) {
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (o.rfind("parallel.", 0) != 0 || eq == std::string::npos) continue;
    const std::string key = o.substr(9, eq - 9), value = o.substr(eq + 1);
    json v;
    try {
      v = parse_json(value, "--set");
    } catch (const Error&) {
      v = value;
    }
    apply(key, v);
  }
  return p;
}

}  // namespace llmc
