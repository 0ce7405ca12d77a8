// llmc/run/cli.cpp: the train_gpt command line. The CLI11 definitions below are the only description of the flags: --help is
// generated from them. Also the world-size detection and the --dry-run report and checks (which need no GPU).
#include "llmc/run/cli.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "llmc/core/common.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/data.h"
#include "llmc/model/family.h"
#include "llmc/run/memory_plan.h"

namespace llmc {

int parse_cli(int argc, char** argv, CliOptions* out) {
  CLI::App app{
      "train_gpt: pretrain a GPT-2 model from a JSON run config (llm.c style, one binary, precision recipes at run "
      "time).",
      "train_gpt"};
  app.add_option("--config", out->config_path, "the JSON run config, e.g. configs/gpt2_124m_bf16.json (required)")
      ->type_name("FILE.json");
  app.add_option("--set", out->overrides,
                 "override one config key, repeatable: --set train.lr=3e-4 --set data.train=\"d/*.bin\"; the value "
                 "is read as JSON (numbers, true/false) or as text for string keys")
      ->type_name("SECTION.KEY=VALUE")
      ->allow_extra_args(false);
  app.add_flag("--dry-run", out->dry_run,
               "validate the config, print the model size, FLOPs/token and the device memory per GPU by what holds "
               "it (weights, master weights, gradients, optimizer states, precision state, saved activations, "
               "logits, transient buffers, workspace; from the allocation plan of the recipe and state format), "
               "check that the data globs match valid shards (headers only) and that checkpoint.dir can be written, "
               "and exit: 0, or 1 naming each problem a run would stop at (no GPU needed, nothing written)");
  app.add_flag("--print-config", out->print_config,
               "print the resolved config (presets expanded, every key) as JSON and exit; the output is a valid "
               "--config file");
  app.add_flag("--list-keys", out->list_keys, "list every config key with its type, default and meaning, and exit");
  app.add_option("--stop-at-step", out->stop_at_step,
                 "stop after this optimizer step as if the job were killed there (the LR schedule still spans "
                 "train.steps; a checkpoint is written there when checkpoint.every divides it); for resume tests")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  CLI::Option* export_hf =
      app.add_option("--export-hf", out->export_hf,
                     "write the weights this run would start from (the checkpoint checkpoint.resume resolves to, "
                     "else train.init_from, else the initialisation from train.seed) as a Hugging Face model: "
                     "DIR/config.json + DIR/model.safetensors (GPT2LMHeadModel / LlamaForCausalLM, unpadded "
                     "vocabulary), then exit; no GPU needed")
          ->type_name("DIR");
  CLI::Option* export_llmc =
      app.add_option("--export-llmc", out->export_llmc,
                     "write the same weights as an llm.c model file (GPT-2 only; version 3 = float32, 5 = bfloat16), "
                     "then exit; combinable with --export-hf")
          ->type_name("FILE.bin");
  app.add_option("--export-dtype", out->export_dtype,
                 "dtype of the exported tensors (bfloat16 rounds the FP32 weights to nearest even once)")
      ->type_name("float32|bfloat16")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_flag("--force", out->force,
               "let --export-hf write into a non-empty directory and --export-llmc over an existing file (never into "
               "a checkpoint step directory)");
  export_hf->excludes("--dry-run")->excludes("--print-config");
  export_llmc->excludes("--dry-run")->excludes("--print-config");
  app.footer(
      "Examples:\n"
      "  train_gpt --config configs/gpt2_mini_bf16.json\n"
      "  train_gpt --config configs/gpt2_124m_bf16.json --set train.lr=3e-4 --set train.micro_batch=8 --dry-run\n"
      "  train_gpt --config configs/gpt2_mini_bf16.json --export-hf runs/gpt2_mini_hf   (from the newest checkpoint)\n"
      "  train_gpt --config configs/gpt2_tiny_bf16.json --set train.init_from=runs/hf --export-llmc gpt2_tiny.bin\n"
      "One process trains on one GPU. Data parallelism over several GPUs and nodes (NCCL, ZeRO-1) runs one process "
      "per GPU:\n"
      "  scripts/run_local.sh 2 configs/gpt2_124m_bf16.json       the GPUs of this machine\n"
      "  scripts/run_mpi.sh 8 configs/gpt2_350m_bf16.json         Open MPI (mpirun -np 8)\n"
      "  sbatch scripts/slurm_srun.sbatch configs/gpt2_774m_bf16.json   Slurm (srun)\n"
      "  or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (see the parallel.* keys\n"
      "  and the README, Multi-GPU and multi-node).\n"
      "Config keys and presets: train_gpt --list-keys, and configs/README.md.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // prints the help to stdout, returns 0
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\nrun 'train_gpt --help' for the usage\n", e.what());
    return 2;
  }

  if (out->list_keys) {
    std::vector<ConfigKeyDoc> docs = config_key_docs();
    size_t key_width = 0, type_width = 0, default_width = 0;
    for (const ConfigKeyDoc& d : docs) {
      key_width = std::max(key_width, d.key.size());
      type_width = std::max(type_width, d.type.size());
      default_width = std::max(default_width, d.default_value.size());
    }
    std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(key_width), "key", static_cast<int>(type_width), "type",
                static_cast<int>(default_width), "default", "meaning");
    for (const ConfigKeyDoc& d : docs)
      std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(key_width), d.key.c_str(), static_cast<int>(type_width),
                  d.type.c_str(), static_cast<int>(default_width), d.default_value.c_str(), d.help.c_str());
    return 0;
  }
  if (out->config_path.empty()) {
    std::fprintf(stderr, "error: --config FILE.json is required (see configs/ for examples; run 'train_gpt --help')\n");
    return 2;
  }
  return -1;
}

int detect_world_size() {
  static const char* const kVariables[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
  for (const char* name : kVariables) {
    const char* value = std::getenv(name);
    if (!value || !*value) continue;
    char* end = nullptr;
    errno = 0;
    long n = std::strtol(value, &end, 10);
    if (errno != 0 || *end != '\0' || n < 1 || n > 1000000)
      throw_error("environment variable %s='%s' is not a positive integer world size (unset it or fix the launcher)",
                  name, value);
    return static_cast<int>(n);
  }
  return 1;
}

std::string with_thousands(unsigned long long n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); i++) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string dry_run_report(const RunConfig& cfg, int world_size) {
  const ModelSpec& m = cfg.model;
  const TrainConfig& t = cfg.train;
  ParamTable table = build_param_table(m);
  size_t padded = count_parameters(m, true), real = count_parameters(m, false);
  double flops = flops_per_token(m, t.seq_len);
  long long tokens_per_step = t.global_batch_tokens;
  double total_tokens = static_cast<double>(tokens_per_step) * t.steps;
  const MemoryPlan mem = plan_memory(cfg, world_size);

  std::string r;
  r += "dry run: the config is valid (nothing was run or written)\n";
  const std::string details = model_family(m.arch).dry_run_details(m);
  r += strformat("model        %s%s: %d layers, %d heads of %d, n_embd %d, ffn %d, vocab %d (padded %d), context %d%s\n",
                 m.arch.c_str(), cfg.model_preset.empty() ? "" : (" (preset " + cfg.model_preset + ")").c_str(),
                 m.n_layer, m.n_head, m.head_size(), m.n_embd, m.ffn_hidden, m.vocab_size, m.padded_vocab_size,
                 m.max_seq_len, details.c_str());
  r += strformat("parameters   %s (%s without vocabulary padding), %zu tensors\n", with_thousands(padded).c_str(),
                 with_thousands(real).c_str(), table.params.size());
  r += strformat("FLOPs/token  %.4g (6N + 6LCT at T = %d)\n", flops, t.seq_len);
  r += strformat("batch        %d seq x %d tokens x %d GPU%s x %d accumulation steps = %s tokens per step\n",
                 t.micro_batch, t.seq_len, world_size, world_size == 1 ? "" : "s", cfg.grad_accum_steps,
                 with_thousands(static_cast<unsigned long long>(tokens_per_step)).c_str());
  r += strformat("training     %s steps = %.4g tokens, %.4g FLOPs in total\n",
                 with_thousands(static_cast<unsigned long long>(t.steps)).c_str(), total_tokens, total_tokens * flops);
  r += strformat("schedule     lr %g, %s, warmup %d steps, final lr fraction %g; AdamW betas (%g, %g), wd %g\n", t.lr,
                 t.schedule.c_str(), t.warmup_steps, t.final_lr_frac, cfg.optimizer.beta1, cfg.optimizer.beta2,
                 cfg.optimizer.weight_decay);
  r += strformat("precision    %s\n", cfg.precision.recipe.c_str());
  r += strformat("memory/GPU   %s estimated from the allocation plan (%s, optimizer.state_format %s%s):\n",
                 format_gib(mem.total()).c_str(), cfg.precision.recipe.c_str(), cfg.optimizer.state_format.name,
                 mem.sharded ? strformat(", ZeRO-1 over %d ranks", world_size).c_str() : "");
  r += format_memory_plan(mem, "  ");
  r += "resolved config:\n";
  nlohmann::json j = config_to_json(cfg);
  for (auto& [section, keys] : j.items()) {
    std::string line = "  " + section + ":";
    for (auto& [key, value] : keys.items()) line += " " + key + "=" + value.dump();
    r += line + "\n";
  }
  return r;
}

namespace {

namespace fs = std::filesystem;

// "" when the run can write into dir as it would (create_directories, then files): an existing writable directory, or
// a missing one whose nearest existing parent is a writable directory; else what is wrong.
std::string directory_write_problem(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::path(dir).lexically_normal();
  if (fs::exists(p, ec)) {
    if (!fs::is_directory(p, ec)) return "it exists and is not a directory";
    if (::access(p.c_str(), W_OK | X_OK) != 0) return strformat("it is not writable (%s)", std::strerror(errno));
    return "";
  }
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  if (p.empty()) p = ".";
  if (!fs::is_directory(p, ec)) return strformat("it cannot be created: %s is not a directory", p.c_str());
  if (::access(p.c_str(), W_OK | X_OK) != 0)
    return strformat("it cannot be created: %s is not writable (%s)", p.c_str(), std::strerror(errno));
  return "";
}

void check_shards(const char* key, const std::string& glob, DryRunChecks* out) {
  const std::vector<std::string> paths = expand_glob(glob);
  if (paths.empty()) {
    out->problems.push_back(strformat("%s: no files match '%s' (check the path, or prepare shards with "
                                      "dev/data/prepare.py)", key, glob.c_str()));
    return;
  }
  size_t tokens = 0, bad = 0;
  for (const std::string& path : paths) {
    try {
      tokens += read_shard_header(path).num_tokens;
    } catch (const Error& e) {
      out->problems.push_back(strformat("%s: %s", key, e.what()));
      bad++;
    }
  }
  if (bad == 0)
    out->passed.push_back(strformat("%s: %zu shard(s) match '%s', %s tokens (headers and sizes valid)", key,
                                    paths.size(), glob.c_str(), with_thousands(tokens).c_str()));
}

}  // namespace

DryRunChecks dry_run_checks(const RunConfig& cfg) {
  DryRunChecks out;
  check_shards("data.train", cfg.data.train, &out);
  if (!cfg.data.val.empty()) check_shards("data.val", cfg.data.val, &out);
  std::error_code ec;
  if (cfg.sample.tokens > 0 && !fs::is_regular_file(cfg.data.tokenizer, ec))
    out.problems.push_back(strformat("data.tokenizer: %s is not a file (sampling decodes with it; set sample.tokens=0 "
                                     "to sample nothing)", cfg.data.tokenizer.c_str()));

  const CheckpointConfig& ck = cfg.checkpoint;
  if (!ck.dir.empty()) {
    if (const std::string problem = directory_write_problem(ck.dir); !problem.empty())
      out.problems.push_back(strformat("checkpoint.dir %s: %s", ck.dir.c_str(), problem.c_str()));
    else
      out.passed.push_back(strformat("checkpoint.dir %s: %s", ck.dir.c_str(),
                                     fs::exists(ck.dir, ec) ? "writable" : "can be created"));
    if (ck.resume == "none") {
      try {
        const size_t n = checkpoints_left_behind(list_complete_checkpoints(ck.dir), std::nullopt, false, ck.overwrite,
                                                 ck.dir, ck.resume).size();
        if (n > 0)
          out.passed.push_back(strformat("checkpoint.overwrite: the %zu checkpoint(s) in %s would be moved into "
                                         "%s/abandoned/", n, ck.dir.c_str(), ck.dir.c_str()));
      } catch (const Error& e) {
        out.problems.push_back(e.what());
      }
    }
  }
  if (ck.resume != "auto" && ck.resume != "none" && !is_checkpoint_step_dir(ck.resume))
    out.problems.push_back(strformat("checkpoint.resume: %s is not a checkpoint step directory (use auto, none, or a "
                                     "<run>/step_NNNNNNNN directory)", ck.resume.c_str()));
  if (!cfg.train.init_from.empty() && !fs::exists(cfg.train.init_from, ec))
    out.problems.push_back(strformat("train.init_from: %s does not exist", cfg.train.init_from.c_str()));
  if (!cfg.log.jsonl.empty()) {
    const std::string parent = fs::path(cfg.log.jsonl).parent_path().string();
    if (fs::is_directory(cfg.log.jsonl, ec))
      out.problems.push_back(strformat("log.jsonl %s is a directory", cfg.log.jsonl.c_str()));
    else if (const std::string problem = directory_write_problem(parent.empty() ? "." : parent); !problem.empty())
      out.problems.push_back(strformat("log.jsonl %s: its directory %s: %s", cfg.log.jsonl.c_str(),
                                       parent.empty() ? "." : parent.c_str(), problem.c_str()));
  }
  return out;
}

}  // namespace llmc
