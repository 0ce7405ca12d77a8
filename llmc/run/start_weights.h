// llmc/run/start_weights.h: the weights a run with a config starts from (a checkpoint, train.init_from, verified and
// checked for NaN / Inf, or the initialisation from train.seed), and train_gpt's --export-hf / --export-llmc of them
// (which never overwrite a checkpoint, and other files only with --force).
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

// The weights of train.init_from for cfg.model (load_weights). A checkpoint step directory, or a file in one, is
// verified first as a resume would (DONE and every checksum); weights holding NaN or Inf are refused naming the
// tensor and the element, unless train.allow_nonfinite_init. Returns the description of the source.
std::string load_init_from(const RunConfig& cfg, float* values);

// Where --export-hf DIR / --export-llmc FILE may write, checked before anything is read: never into a checkpoint step
// directory (its files are checksummed; the export would corrupt it) nor over something that is not a regular file;
// into a non-empty DIR or over an existing FILE only with force (--force). llmc::Error naming the path otherwise.
void check_export_targets(const std::string& hf_dir, const std::string& llmc_path, bool force);

// train_gpt --export-hf DIR / --export-llmc FILE: the run's start weights (run_start_weights) written to either or
// both (check_export_targets first); prints what it read and wrote. Returns the exit code (0).
int export_run_weights(const RunConfig& cfg, const std::string& hf_dir, const std::string& llmc_path,
                       WeightDtype dtype, bool force = false);

}  // namespace llmc
