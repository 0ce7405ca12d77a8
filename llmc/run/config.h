// llmc/run/config.h: the run configuration. One schema (section, key, type, default, allowed range, help) drives JSON
// loading, `--set section.key=value` overrides, validation (unknown keys with a suggestion, wrong types, ranges,
// impossible combinations), the resolved-config dump and the key reference in configs/README.md.
// Model presets fill the model section; recipe presets fill the precision section; explicit keys win over presets.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/distributed/launch.h"
#include "llmc/model/model_spec.h"
#include "llmc/optim/adamw.h"
#include "llmc/precision/recipe.h"

namespace llmc {

struct DataConfig {
  std::string train = "";         // glob of training shards, e.g. "data/kjv/kjv_train_*.bin"
  std::string val = "";           // glob of validation shards ("" = no validation)
  bool shuffle = true;            // shuffle the order of sequences (per epoch, seeded)
  int seed = 1337;                // data shuffling seed
  std::string tokenizer = "dev/data/gpt2/encoder.json";  // GPT-2 vocabulary used to decode samples
  bool check_tokens = true;       // scan every token of every shard against the vocabulary before the first step
};

struct TrainConfig {
  int micro_batch = 4;            // sequences per GPU per micro-step (B)
  int seq_len = 1024;             // tokens per sequence (T)
  long long global_batch_tokens = 0;  // tokens per optimizer step over all GPUs; 0 = micro_batch * seq_len * world
  int steps = 100;                // optimizer steps
  double lr = 6e-4;               // peak learning rate
  int warmup_steps = 0;           // linear warm-up steps
  std::string schedule = "cosine";  // cosine | linear | constant | wsd
  double final_lr_frac = 0.1;     // lr at the end of decay, as a fraction of lr
  double wsd_decay_frac = 0.2;    // wsd: fraction of the steps spent decaying at the end
  double grad_clip = 1.0;         // global gradient-norm clip; 0 = off
  int seed = 42;                  // parameter initialisation seed
  int recompute = 0;              // 0 = keep all activations; 1 = recompute the norm and GELU / SwiGLU outputs
  bool deterministic = true;      // bit-identical runs (deterministic kernels and GEMM algorithms)
  std::string init_from = "";     // "" = random init; else llm8 weights, a Hugging Face directory or an llm.c .bin
  int max_skipped_steps = 5;      // divergence guard: stop after this many consecutive skipped (non-finite) steps
  bool allow_nonfinite_init = false;  // load init_from weights holding NaN / Inf instead of refusing them
};




struct CheckpointConfig {
  std::string dir = "";           // run directory ("" = no checkpoints)
  int every = 0;                  // write a checkpoint every N steps (0 = only at the end when dir is set)
  int keep = 3;                   // keep the newest N complete checkpoints (0 = keep all)
  std::string resume = "auto";    // auto = newest complete checkpoint in dir if any | none | path to a step dir
  bool overwrite = false;         // a new run in a dir holding checkpoints moves them into dir/abandoned/ (else: error)
};

struct EvalConfig {
  int every = 0;                  // validation loss every N steps (0 = off; also evaluated at the end if val is set)
  int batches = 20;               // micro-batches per validation
};

struct SampleConfig {
  int every = 0;                  // sample every N steps (0 = only at the end)
  int tokens = 64;                // tokens to generate
  double temperature = 1.0;
  int top_k = 0;                  // 0 = full distribution
  int seed = 1337;                // sampling starts from <|endoftext|>
};

struct LogConfig {
  int every = 1;                  // console line every N steps
  std::string jsonl = "";         // JSONL metrics file ("" = <checkpoint.dir>/metrics.jsonl when dir is set)
  int numerics_every = 0;         // numerics telemetry every N steps into the JSONL log (0 = off)
  bool numerics_products = false; // telemetry steps also measure each quantised product against BF16's
};

struct RunConfig {
  std::string model_preset;       // the preset named in model.preset ("" = none)
  ModelSpec model;                // resolved model
  int padded_vocab_multiple = 128;  // model.padded_vocab_multiple: model.padded_vocab_size = vocab rounded up to it
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  PrecisionRecipe precision;      // the precision section: a preset (precision.recipe) with any field overridden
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  SampleConfig sample;
  LogConfig log;

  // Derived by validate(): gradient-accumulation micro-steps per optimizer step for the world size.
  int grad_accum_steps = 1;
};

// Load a JSON file (a regular file of at most 16 MiB; read by llmc/core/input_safety's parse_json, so an llmc::Error
// names the file and the line for syntax errors, a key given twice, nesting deeper than 64 levels and numbers that do
// not fit a double), apply the overrides ("section.key=value"; value parsed as JSON, or taken as a string when it is
// not valid JSON), resolve presets, validate against the schema (every size key bounded above too, sizes derived from
// several keys in checked 64-bit arithmetic) and for a world of `world_size` ranks. Every problem is an llmc::Error
// whose message names the key (e.g. "config: unknown key 'train.lrr' (did you mean 'train.lr'?)").
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size = 1);
RunConfig load_config_json(const nlohmann::json& j, const std::vector<std::string>& overrides, int world_size = 1);

// Validation of the combinations (batch divides, seq_len <= context, head size supported, known recipe...).
void validate_config(RunConfig& cfg, int world_size);

// The fully resolved config as JSON (every key, presets expanded), as saved with checkpoints and printed by
// --print-config. load_config_json(to_json(cfg)) gives back the same config.
nlohmann::json config_to_json(const RunConfig& cfg);

// One line per key: "section.key  type  default  help", for --help and the configs/README.md check.
struct ConfigKeyDoc {
  std::string key, type, default_value, help;
};
std::vector<ConfigKeyDoc> config_key_docs();

// Recipe presets known to this build, in the order of the preset table (llmc/precision/recipe.cpp).
std::vector<std::string> recipe_names();

// The parallel section for a rank whose config failed to load: read leniently from the config file and the
// parallel.* --set overrides (anything unreadable keeps its default), so that the rank can still join the
// rendezvous and tell the others why it stops.
ParallelConfig bootstrap_parallel_config(const std::string& config_path, const std::vector<std::string>& overrides);

}  // namespace llmc
