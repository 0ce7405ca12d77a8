// llmc/run/start_weights.h: the weights a run with a config starts from (a checkpoint, train.init_from or the
// initialisation from train.seed), and train_gpt's --export-hf / --export-llmc of them.
#pragma once

#include <string>
#include <vector>

#include "llmc/io/interop.h"
#include "llmc/run/config.h"

namespace llmc {

// The weights a run with this config starts from, as the trainer picks them: the checkpoint that checkpoint.resume
// resolves to (its model section must match the config), else train.init_from, else the initialisation from
// train.seed. Returns the description of the source; notes about skipped checkpoints are appended to notes.
std::string run_start_weights(const RunConfig& cfg, float* values, std::vector<std::string>* notes = nullptr);

// train_gpt --export-hf DIR / --export-llmc FILE: the run's start weights (run_start_weights) written to either or
// both; prints what it read and wrote. Returns the exit code (0).
int export_run_weights(const RunConfig& cfg, const std::string& hf_dir, const std::string& llmc_path,
                       WeightDtype dtype);

}  // namespace llmc
