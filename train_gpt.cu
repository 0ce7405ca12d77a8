// train_gpt: the run driver. This version is the command-line front: flags → config (presets, overrides,
// validation for the launcher's world size) → --print-config / --dry-run, then run_training. The training loop itself
// (devices, model, data, optimizer, checkpoints) is filled in by the trainer work; until then run_training refuses.
#include <cstdio>
#include <exception>
#include <string>

#include "llmc/cli.h"
#include "llmc/common.h"
#include "llmc/config.h"

// Trains the model the config describes. Returns the process exit code; throws llmc::Error on user-facing problems.
int run_training(const llmc::RunConfig& cfg) {
  if (llmc::cuda_device_count() == 0)
    llmc::throw_error(
        "no CUDA GPU found: training needs an NVIDIA GPU (compute capability 8.0 or newer); use --dry-run to check a "
        "config without one");
  llmc::throw_error("training loop not in this build (found %s): use --dry-run to check the config",
                    llmc::cuda_device_name(0).c_str());
}

int main(int argc, char** argv) {
  llmc::CliOptions options;
  int rc = llmc::parse_cli(argc, argv, &options);
  if (rc >= 0) return rc;
  try {
    int world_size = llmc::detect_world_size();
    llmc::RunConfig cfg = llmc::load_config(options.config_path, options.overrides, world_size);
    if (options.print_config) std::printf("%s\n", llmc::config_to_json(cfg).dump(2).c_str());
    if (options.dry_run) std::printf("%s", llmc::dry_run_report(cfg, world_size).c_str());
    if (options.print_config || options.dry_run) return 0;
    return run_training(cfg);
  } catch (const llmc::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // a bug, not a user error: still a message and exit code 1, not an abort
    std::fflush(stdout);
    std::fprintf(stderr, "error: internal error: %s\n", e.what());
    return 1;
  }
}
