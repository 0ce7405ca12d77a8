// llmc/run/start_weights.cpp: the weights a run starts from, and their export (llmc/run/start_weights.h).
#include "llmc/run/start_weights.h"

#include <cstdio>
#include <filesystem>
#include <optional>

#include "llmc/core/common.h"
#include "llmc/io/checkpoint.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace llmc {

std::string run_start_weights(const RunConfig& cfg, float* values, std::vector<std::string>* notes) {
  const ParamTable table = build_param_table(cfg.model);
  std::optional<std::string> resume_dir;
  if (!cfg.checkpoint.dir.empty() || (cfg.checkpoint.resume != "auto" && cfg.checkpoint.resume != "none"))
    resume_dir = resolve_resume(cfg.checkpoint.resume, cfg.checkpoint.dir, notes);
  if (resume_dir) {
    const TrainerState state = load_trainer_state(*resume_dir);
    // As the trainer: the checkpoint's model section must equal this config's.
    const json saved = state.config.value("model", json::object());
    const json now = config_to_json(cfg)["model"];
    for (auto it = now.begin(); it != now.end(); ++it)
      if (it.key() != "preset" && saved.contains(it.key()) && saved[it.key()] != it.value())
        throw_error("checkpoint %s was written for model.%s = %s but this config has %s: use the run's config (or "
                    "set checkpoint.resume to \"none\")",
                    resume_dir->c_str(), it.key().c_str(), saved[it.key()].dump().c_str(), it.value().dump().c_str());
    load_weights(*resume_dir, cfg.model, values);  // the step directory's model.safetensors
    return strformat("checkpoint %s (step %lld)", resume_dir->c_str(), static_cast<long long>(state.step));
  }
  if (!cfg.train.init_from.empty()) return "train.init_from: " + load_init_from(cfg, values);
  init_parameters(table, static_cast<uint64_t>(cfg.train.seed), values);
  return strformat("fresh initialisation (train.seed = %d)", cfg.train.seed);
}

std::string load_init_from(const RunConfig& cfg, float* values) {
  const std::string& path = cfg.train.init_from;
  std::error_code ec;
  const std::string step_dir = fs::is_directory(path, ec) ? path : fs::path(path).parent_path().string();
  if (!step_dir.empty() && is_checkpoint_step_dir(step_dir)) {
    try {
      verify_checkpoint(step_dir);
    } catch (const Error& e) {
      throw_error("train.init_from: %s", e.what());
    }
  }
  const std::string source = load_weights(path, cfg.model, values);
  if (!cfg.train.allow_nonfinite_init)
    if (const std::string bad = first_nonfinite_element(build_param_table(cfg.model), values); !bad.empty())
      throw_error("train.init_from: %s holds a value that is not finite: %s (broken weights would train to NaN; set "
                  "train.allow_nonfinite_init=true to load them anyway)", source.c_str(), bad.c_str());
  return source;
}

void check_export_targets(const std::string& hf_dir, const std::string& llmc_path, bool force) {
  const char* redo = "choose another path, or add --force to overwrite it";
  std::error_code ec;
  if (!hf_dir.empty()) {
    if (is_checkpoint_step_dir(hf_dir))
      throw_error("--export-hf %s is a checkpoint step directory: the export would overwrite its checksummed "
                  "model.safetensors (even with --force); choose another directory", hf_dir.c_str());
    if (fs::exists(hf_dir, ec) && !fs::is_directory(hf_dir, ec))
      throw_error("--export-hf %s exists and is not a directory", hf_dir.c_str());
    if (fs::is_directory(hf_dir, ec) && !fs::is_empty(hf_dir, ec) && !force)
      throw_error("--export-hf %s is not empty: %s", hf_dir.c_str(), redo);
  }
  if (!llmc_path.empty()) {
    const std::string parent = fs::path(llmc_path).parent_path().string();
    if (!parent.empty() && is_checkpoint_step_dir(parent))
      throw_error("--export-llmc %s would write into the checkpoint step directory %s (even with --force); choose "
                  "another path", llmc_path.c_str(), parent.c_str());
    if (fs::exists(fs::symlink_status(llmc_path, ec)) && !fs::is_regular_file(llmc_path, ec))
      throw_error("--export-llmc %s exists and is not a regular file; choose another path", llmc_path.c_str());
    if (fs::exists(llmc_path, ec) && !force) throw_error("--export-llmc %s exists: %s", llmc_path.c_str(), redo);
  }
}

int export_run_weights(const RunConfig& cfg, const std::string& hf_dir, const std::string& llmc_path,
                       WeightDtype dtype, bool force) {
  check_export_targets(hf_dir, llmc_path, force);  // before anything is read or written
  check_exportable(cfg.model, llmc_path, dtype);
  const ParamTable table = build_param_table(cfg.model);
  std::vector<float> values(table.total_elements, 0.0f);
  std::vector<std::string> notes;
  const std::string source = run_start_weights(cfg, values.data(), &notes);
  for (const std::string& note : notes) std::printf("checkpoint: %s\n", note.c_str());
  std::printf("export: weights from %s\n", source.c_str());
  const std::string what = strformat("%s, %d layers, n_embd %d, vocab %d, %s", cfg.model.arch.c_str(),
                                     cfg.model.n_layer, cfg.model.n_embd, cfg.model.vocab_size,
                                     weight_dtype_name(dtype));
  if (!hf_dir.empty()) {
    for (const std::string& path : export_hf(hf_dir, cfg.model, values.data(), dtype))
      std::printf("export: wrote %s (%s bytes)\n", path.c_str(),
                  std::to_string(fs::file_size(path)).c_str());
    std::printf("export: Hugging Face model (%s) in %s\n", what.c_str(), hf_dir.c_str());
  }
  if (!llmc_path.empty()) {
    export_llmc(llmc_path, cfg.model, values.data(), dtype);
    std::printf("export: wrote %s (%s bytes): llm.c model file version %d (%s)\n", llmc_path.c_str(),
                std::to_string(fs::file_size(llmc_path)).c_str(),
                dtype == WeightDtype::F32 ? kLlmcVersionF32 : kLlmcVersionBF16, what.c_str());
  }
  return 0;
}

}  // namespace llmc
