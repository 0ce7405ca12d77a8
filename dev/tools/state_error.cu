// dev/tools/state_error.cu: COAT's Table 1 (arXiv 2410.19313: the error of m/sqrt(v) by optimizer-state format) in
// our numbers. Reads the FP32 AdamW moments of a checkpoint (a run with optimizer.state_format fp32, any world size and
// ZeRO stage), stores them in every other state format with the host codecs (llmc/optim/state_format.h: the
// quantisers the update kernel runs, bit for bit) and reads them back. The FP32 moments are the shadow: each number is
// the error one store adds to the real state of that step.
//
//   state_error --checkpoint STEP_DIR [--markdown FILE] [--threads N]
//
// Per format (bf16, fp8, fp8_expand), over every element of the flat parameter buffer:
//   m, v      relative L2 error ||x' - x|| / ||x|| of the stored-and-read moment;
//   u         the update direction of that step, u = m_hat / (sqrt(v_hat) + eps) with AdamW's bias corrections
//             (m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t), t = the checkpoint's step; betas and eps from its
//             config): relative L2 error and mean squared error (COAT's Table 1 reports the MSE of m/sqrt(v));
//   m -> 0    the fraction of nonzero m that read back as 0;
//   k         fp8_expand only: quantiles of the Dynamic Range Expansion exponent of m's and v's groups (k > 1 expands
//             a group's range, k < 1 compresses it).
// --markdown writes the same table as Markdown, with the checkpoint, model and step in its first line. The measurement
// itself is llmc/optim/state_format_error.h (tested in test/optim/test_state_format_error.cpp).
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "llmc/core/common.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/optimizer_files.h"
#include "llmc/model/model_spec.h"
#include "llmc/optim/state_format_error.h"
#include "llmc/run/config.h"

using namespace llmc;

namespace {

std::string quantiles(std::vector<float> k) {
  if (k.empty()) return "—";
  std::sort(k.begin(), k.end());
  auto q = [&](double p) { return k[static_cast<size_t>(p * static_cast<double>(k.size() - 1))]; };
  const double expanded =
      static_cast<double>(k.end() - std::upper_bound(k.begin(), k.end(), 1.0f)) / static_cast<double>(k.size());
  return strformat("%.3g / %.3g / %.3g / %.3g / %.3g (k > 1: %.1f%%)", q(0), q(0.1), q(0.5), q(0.9), q(1),
                   100.0 * expanded);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"COAT's Table 1 in our numbers: the error each optimizer-state format adds to a checkpoint's FP32 moments"};
  std::string step_dir, markdown;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("--checkpoint", step_dir, "a checkpoint step dir of a run with optimizer.state_format fp32")
      ->required();
  app.add_option("--markdown", markdown, "also write the table to this Markdown file");
  app.add_option("--threads", threads, "host threads for the codecs (default: every core)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads < 1) throw_error("--threads must be at least 1 (got %d)", threads);
    const TrainerState state = verify_checkpoint(step_dir);
    const RunConfig cfg = load_config_json(state.config, {}, state.world_size);
    const ParamTable table = build_param_table(cfg.model);
    const size_t n = table.total_elements;
    std::string note;
    const StoredMoments saved =
        read_optimizer_moments(step_dir, state, table, {{0, n}}, StateFormat::fp32(), &note);
    if (!note.empty())
      throw_error("%s: the moments are not stored in fp32 (%s); state_error measures the other formats against "
                  "FP32 moments: give a checkpoint of a run with optimizer.state_format=fp32",
                  step_dir.c_str(), note.c_str());
    const float* m = reinterpret_cast<const float*>(saved.m.data());  // fp32: the codes are the values
    const float* v = reinterpret_cast<const float*>(saved.v.data());

    const AdamWStepShape shape{cfg.optimizer.beta1, cfg.optimizer.beta2, cfg.optimizer.eps, state.step};
    std::vector<std::string> rows;
    for (const StateFormat& format : state_formats()) {
      if (format == StateFormat::fp32()) continue;
      const StateFormatError e = state_format_error(format, m, v, n, shape, threads);
      rows.push_back(strformat("| %s | %.3e | %.3e | %.3e | %.3e | %.4f%% | %s | %s |", format.name, e.m_rel_l2,
                               e.v_rel_l2, e.u_rel_l2, e.u_mse, 100.0 * e.m_lost, quantiles(e.k_m).c_str(),
                               quantiles(e.k_v).c_str()));
    }
    const std::string model = cfg.model_preset.empty() ? "model of the checkpoint's config" : cfg.model_preset;
    std::vector<std::string> lines = {
        strformat("%s, step %lld, %zu elements (%s), betas %g / %g, eps %g: each format's store-and-read error "
                  "against the FP32 moments",
                  step_dir.c_str(), static_cast<long long>(state.step), n, model.c_str(), cfg.optimizer.beta1,
                  cfg.optimizer.beta2, cfg.optimizer.eps),
        "",
        "| format | m rel. L2 | v rel. L2 | u = m/sqrt(v) rel. L2 | u MSE | nonzero m read as 0 | k of m: min / p10 / "
        "median / p90 / max | k of v |",
        "|---|---|---|---|---|---|---|---|"};
    lines.insert(lines.end(), rows.begin(), rows.end());
    std::string text;
    for (const std::string& l : lines) text += l + "\n";
    std::fputs(text.c_str(), stdout);
    if (!markdown.empty()) {
      FILE* f = std::fopen(markdown.c_str(), "w");
      if (!f) throw_error("--markdown %s: cannot open for writing", markdown.c_str());
      std::fputs(text.c_str(), f);
      std::fclose(f);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "state_error: %s\n", e.what());
    return 1;
  }
}
