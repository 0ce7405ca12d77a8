// llmc/run/cli.h: the train_gpt command line (CLI11): flag definitions (the same ones --help prints), the world-size
// detection from launcher environment variables, and the --dry-run report and checks.
#pragma once

#include <string>
#include <vector>

#include "llmc/run/config.h"

namespace llmc {

struct CliOptions {
  std::string config_path;             // --config FILE.json
  std::vector<std::string> overrides;  // --set section.key=value, in order
  bool dry_run = false;                // --dry-run: validate and report, no GPU needed
  bool print_config = false;           // --print-config: print the resolved config as JSON
  bool list_keys = false;              // --list-keys: print every config key with type, default and help
  int stop_at_step = 0;                // --stop-at-step N: end the run after optimizer step N (0 = train.steps)
  std::string export_hf;               // --export-hf DIR: write the run's start weights as a Hugging Face model, exit
  std::string export_llmc;             // --export-llmc FILE: write them as an llm.c model file (GPT-2), exit
  std::string export_dtype = "float32";  // --export-dtype float32|bfloat16
  bool force = false;                  // --force: exports may write into a non-empty directory / over a file
  bool exporting() const { return !export_hf.empty() || !export_llmc.empty(); }
};

// Parses argv into out. Returns -1 to continue, or the exit code to return from main: 0 after --help or --list-keys
// (their text already printed to stdout), 2 on a usage error (the CLI11 message printed to stderr).
int parse_cli(int argc, char** argv, CliOptions* out);

// The --dry-run text: model, parameter count, FLOPs/token, batch and gradient accumulation, the memory plan of one
// GPU (llmc/run/memory_plan.h) and the resolved config, for a run over world_size GPUs.
std::string dry_run_report(const RunConfig& cfg, int world_size);

// What --dry-run checks beyond the config, reading only headers and directory entries and writing nothing: data.train
// and data.val match files and every matching shard's header agrees with its size (llmc/io/data read_shard_header);
// checkpoint.dir (and log.jsonl) can be written as the run would (an existing writable directory, or one whose
// nearest existing parent is); resume "none" in a checkpoint.dir holding checkpoints needs checkpoint.overwrite;
// train.init_from, a checkpoint.resume path and (with sampling on) data.tokenizer exist. The run would stop at each
// problem.
struct DryRunChecks {
  std::vector<std::string> passed;    // one line each: what was checked and what was found
  std::vector<std::string> problems;  // one line each, naming the key, the path and the fix
};
DryRunChecks dry_run_checks(const RunConfig& cfg);

// World size from the launcher: WORLD_SIZE (torchrun), OMPI_COMM_WORLD_SIZE (Open MPI), PMI_SIZE (MPICH, Slurm PMI),
// SLURM_NTASKS, in that order; 1 when none is set. A value that is not a positive integer is an llmc::Error.
int detect_world_size();

// "124,475,904"
std::string with_thousands(unsigned long long n);

}  // namespace llmc
