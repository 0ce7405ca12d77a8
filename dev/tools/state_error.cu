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
// --markdown writes the same table as Markdown, with the checkpoint, model and step in its first line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "llmc/core/common.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/optimizer_files.h"
#include "llmc/model/model_spec.h"
#include "llmc/run/config.h"

using namespace llmc;

namespace {

// values -> storage -> values for n elements, split over threads at group boundaries; the k of every fp8_expand
// group is appended to ks (in group order) when ks is given.
void store_and_read(const MomentStorage& storage, const float* values, size_t n, float* out, int threads,
                    std::vector<float>* ks) {
  const size_t align = storage.group_size * 1024;
  const size_t chunk = ((n + threads - 1) / threads + align - 1) / align * align;
  std::vector<std::vector<float>> chunk_ks(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    const size_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    pool.emplace_back([&, t, begin, end] {
      if (begin == end) return;
      const size_t len = end - begin;
      std::vector<uint8_t> block(storage.bytes(len));
      encode_moment(storage, values + begin, len, block.data());
      decode_moment(storage, block.data(), len, out + begin);
      if (ks && storage.scaling == MomentScaling::RangeExpansion) {
        const float* meta = reinterpret_cast<const float*>(block.data());
        for (size_t g = 0; g < storage.num_groups(len); g++)
          chunk_ks[t].push_back(meta[g * static_cast<size_t>(storage.scales_per_group) + 1]);  // scale, k, centre
      }
    });
  }
  for (std::thread& th : pool) th.join();
  if (ks)
    for (const std::vector<float>& c : chunk_ks) ks->insert(ks->end(), c.begin(), c.end());
}

double rel_l2(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

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
    std::vector<float> m(n), v(n);
    std::copy_n(reinterpret_cast<const float*>(saved.m.data()), n, m.data());
    std::copy_n(reinterpret_cast<const float*>(saved.v.data()), n, v.data());

    const double t = static_cast<double>(state.step);
    const double c1 = 1.0 - std::pow(cfg.optimizer.beta1, t), c2 = 1.0 - std::pow(cfg.optimizer.beta2, t);
    const double eps = cfg.optimizer.eps;
    auto direction = [&](const std::vector<float>& mm, const std::vector<float>& vv) {
      std::vector<float> u(n);
      for (size_t i = 0; i < n; i++)
        u[i] = static_cast<float>((mm[i] / c1) / (std::sqrt(std::max(0.0, static_cast<double>(vv[i]) / c2)) + eps));
      return u;
    };
    const std::vector<float> u = direction(m, v);
    size_t nonzero_m = 0;
    for (float x : m) nonzero_m += x != 0.0f;

    std::vector<std::string> rows;
    for (const StateFormat& format : state_formats()) {
      if (format == StateFormat::fp32()) continue;
      std::vector<float> m2(n), v2(n), km, kv;
      store_and_read(format.m, m.data(), n, m2.data(), threads, &km);
      store_and_read(format.v, v.data(), n, v2.data(), threads, &kv);
      const std::vector<float> u2 = direction(m2, v2);
      double mse = 0;
      for (size_t i = 0; i < n; i++) mse += (static_cast<double>(u2[i]) - u[i]) * (static_cast<double>(u2[i]) - u[i]);
      mse /= static_cast<double>(n);
      size_t lost = 0;
      for (size_t i = 0; i < n; i++) lost += m[i] != 0.0f && m2[i] == 0.0f;
      rows.push_back(strformat("| %s | %.3e | %.3e | %.3e | %.3e | %.4f%% | %s | %s |", format.name, rel_l2(m, m2),
                               rel_l2(v, v2), rel_l2(u, u2), mse,
                               nonzero_m ? 100.0 * static_cast<double>(lost) / static_cast<double>(nonzero_m) : 0.0,
                               quantiles(km).c_str(), quantiles(kv).c_str()));
    }
    const std::string model = cfg.model_preset.empty() ? "model of the checkpoint's config" : cfg.model_preset;
    std::vector<std::string> lines = {
        strformat("%s, step %lld, %zu elements (%s), betas %g / %g, eps %g: each format's store-and-read error "
                  "against the FP32 moments",
                  step_dir.c_str(), static_cast<long long>(state.step), n, model.c_str(), cfg.optimizer.beta1,
                  cfg.optimizer.beta2, eps),
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
