// train_gpt: the run driver. Read it top to bottom:
//   flags (llmc/run/cli) → config (llmc/run/config: presets, --set overrides, validation) → --print-config /
//   --dry-run / exports (no GPU) → run_training: the process group (llmc/distributed: one process per GPU; nothing
//   for one GPU) → the device → the training session (llmc/run/session: data, model, optimizer, precision state; the
//   one place that starts, saves and restores a run) → the loop: the learning-rate schedule, one optimizer step at a
//   time, the divergence guard, and on their schedules validation, samples, numerics telemetry and checkpoints, all
//   logged by llmc/run/metrics. Rank 0 prints and writes the logs; every rank checks in at the session's check points,
//   so that an error on one rank stops all of them with a message naming it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "llmc/core/common.h"
#include "llmc/distributed/comm.h"
#include "llmc/distributed/launch.h"
#include "llmc/distributed/rendezvous.h"
#include "llmc/model/model_spec.h"
#include "llmc/optim/schedule.h"
#include "llmc/run/cli.h"
#include "llmc/run/config.h"
#include "llmc/run/metrics.h"
#include "llmc/run/session.h"
#include "llmc/run/start_weights.h"

namespace {

using namespace llmc;

// The device of this process, checked against what the recipe needs.
cudaDeviceProp open_device(const RunConfig& cfg, const Comm& comm) {
  if (cuda_device_count() == 0)
    throw_error("no CUDA GPU found: training needs an NVIDIA GPU (compute capability 8.0 or newer); use --dry-run to "
                "check a config without one");
  CUDA_CHECK(cudaSetDevice(comm.device()));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, comm.device()));
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  const int need_cc = recipe_min_compute_capability(cfg.precision);
  if (prop.major * 10 + prop.minor < need_cc)
    throw_error("precision.recipe = \"%s\" needs compute capability %d.%d or newer (%s); %s is sm_%d%d",
                cfg.precision.recipe.c_str(), need_cc / 10, need_cc % 10,
                need_cc >= 90 ? "block-scaled FP8 GEMMs need Hopper" : need_cc >= 89 ? "FP8 tensor cores" :
                "bf16 tensor cores", prop.name, prop.major, prop.minor);
  return prop;
}

// Numerics telemetry: one JSONL record per quantised tensor (and per product, with log.numerics_products: type
// "product_numerics", its SNR against the BF16 product of the unquantised operands) and a console line with the
// worst SNRs and the tensor with the largest clipped fraction.
void log_numerics(MetricsLogger& logger, int step, const std::vector<TensorNumerics>& numerics) {
  auto finite_or_null = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  struct Worst {
    double snr = INFINITY;
    std::string name;
    size_t count = 0;
  } tensors, products;
  struct Largest {
    double clipped = 0.0;
    std::string name;
  } clipped;
  long long inexact = 0;
  for (const TensorNumerics& t : numerics) {
    nlohmann::json record;
    if (t.product) {
      record = {{"type", "product_numerics"}, {"step", step}, {"product", t.name},
                {"amax", finite_or_null(t.stats.amax)}, {"zeroed_frac", t.stats.underflow_frac},
                {"snr_db", finite_or_null(t.stats.snr_db)}};
    } else {
      record = {{"type", "numerics"}, {"step", step}, {"tensor", t.name},
                {"amax", finite_or_null(t.stats.amax)}, {"scale", finite_or_null(t.stats.scale)},
                {"saturated_frac", t.stats.saturated_frac}, {"underflow_frac", t.stats.underflow_frac},
                {"snr_db", finite_or_null(t.stats.snr_db)}, {"clipped_frac", t.stats.clipped_frac}};
      if (t.stats.clipped_frac > clipped.clipped) clipped = {t.stats.clipped_frac, t.name};
    }
    if (t.inexact_blocks >= 0) {
      record["inexact_blocks"] = t.inexact_blocks;
      inexact += t.inexact_blocks;
    }
    logger.log_record(record);
    Worst& w = t.product ? products : tensors;
    w.count++;
    if (t.stats.snr_db < w.snr) {
      w.snr = t.stats.snr_db;
      w.name = t.name;
    }
  }
  if (tensors.count > 0)
    std::printf("step %d | numerics: %zu quantised tensors, lowest SNR %.1f dB (%s)%s%s%s\n", step, tensors.count,
                tensors.snr, tensors.name.c_str(),
                clipped.name.empty() ? "; nothing clipped"
                                     : strformat("; largest clipped fraction %.3g%% (%s)", 100.0 * clipped.clipped,
                                                 clipped.name.c_str()).c_str(),
                products.count > 0 ? strformat("; %zu products, lowest SNR %.1f dB (%s)", products.count,
                                               products.snr, products.name.c_str()).c_str()
                                   : "",
                inexact > 0 ? strformat("; %lld MXFP4 blocks not exact in E4M3", inexact).c_str() : "");
}

}  // namespace

// The training run. Returns the exit code; throws llmc::Error for user-facing problems.
int run_training(const RunConfig& cfg, const CliOptions& options, const LaunchInfo& launch) {
  // Process group: with several processes, every rank joins (rendezvous, NCCL) and picks the GPU of its local rank;
  // one process needs nothing. Only rank 0 prints (LLM8_ALL_RANKS_PRINT=1 keeps every rank's output).
  Comm comm(launch, cfg.parallel);
  quiet_stdout_unless(comm.is_root() || std::getenv("LLM8_ALL_RANKS_PRINT"));
  const cudaDeviceProp prop = open_device(cfg, comm);
  if (comm.distributed())
    std::printf("parallel: %d ranks (%s, init %s), ZeRO stage %d\n", comm.world_size(), launch.launcher.c_str(),
                comm.method().c_str(), cfg.parallel.zero_stage);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  {
    TrainingSession session(cfg, comm, stream);
    const ModelSpec& spec = cfg.model;
    Model& model = session.model();
    std::printf("model: %s, %s parameters (%s with the padded vocabulary)\n", spec.arch.c_str(),
                with_thousands(count_parameters(spec, false)).c_str(),
                with_thousands(count_parameters(spec, true)).c_str());
    std::printf("precision: %s\n", describe_recipe(cfg.precision).c_str());
    std::printf("optimizer: AdamW, moments stored as %s (%s for m and v on this GPU)\n", cfg.optimizer.state_format.name,
                format_gib(session.memory_plan().bytes("optimizer states")).c_str());
    std::printf("memory: %s estimated for this GPU (--dry-run shows the rows): activations %.1f MiB for %d x %d "
                "tokens%s\n", format_gib(session.memory_plan().total()).c_str(), model.activation_bytes() / 1048576.0,
                cfg.train.micro_batch, cfg.train.seq_len,
                quantizes_linears(cfg.precision)
                    ? strformat(", quantised weight copies, saved inputs and scratch %.1f MiB",
                                model.precision_state()->device_bytes() / 1048576.0).c_str()
                    : "");
    std::printf("batch: %d x %d tokens x %d GPU%s, %d accumulation steps, %s tokens per step\n",
                cfg.train.micro_batch, cfg.train.seq_len, comm.world_size(), comm.world_size() > 1 ? "s" : "",
                cfg.grad_accum_steps, with_thousands(session.tokens_per_step()).c_str());

    session.start();  // resume, init_from or the seeded initialisation
    const int start_step = session.start_step();
    if (start_step >= cfg.train.steps)
      std::printf("nothing to do: the checkpoint is at step %d and train.steps = %d\n", start_step, cfg.train.steps);

    GpuPeaks peaks{0, 0};
    const bool known_gpu = gpu_peaks(prop.name, &peaks);
    MetricsOptions mopt;
    mopt.writer = comm.is_root();
    mopt.jsonl_path = !cfg.log.jsonl.empty() ? cfg.log.jsonl
                      : !cfg.checkpoint.dir.empty() ? cfg.checkpoint.dir + "/metrics.jsonl" : "";
    mopt.resume_step = session.resumed_from() ? start_step : -1;  // records after the checkpoint move to a side file
    mopt.total_steps = cfg.train.steps;
    mopt.console_every = cfg.log.every;
    mopt.flops_per_token = flops_per_token(spec, cfg.train.seq_len);
    mopt.peak_tflops = known_gpu ? peaks.bf16_tflops : 0;
    mopt.world_size = comm.world_size();
    MetricsLogger logger(mopt);
    if (session.resumed_from())
      logger.log_record({{"type", "resume"}, {"step", start_step}, {"from", *session.resumed_from()}});

    auto run_eval = [&](int step) {
      if (session.has_validation()) logger.log_eval(step, session.evaluate());  // "step S/N | val loss L" + JSONL
    };
    auto run_sample = [&](int step) {
      if (comm.is_root() && cfg.sample.tokens > 0) logger.log_sample(step, session.sample());
    };

    const int stop_at = options.stop_at_step > 0 ? std::min(cfg.train.steps, options.stop_at_step) : cfg.train.steps;
    const bool telemetry = cfg.log.numerics_every > 0 && quantizes_linears(cfg.precision);
    if (start_step == 0 && cfg.eval.every > 0) run_eval(0);
    for (int step = start_step; step < stop_at; step++) {
      const double lr = learning_rate(cfg.train.schedule, step, cfg.train.steps, cfg.train.warmup_steps, cfg.train.lr,
                                      cfg.train.final_lr_frac, cfg.train.wsd_decay_frac);
      const int done = step + 1;
      const StepReport r = session.train_step(step, lr, telemetry && done % cfg.log.numerics_every == 0);
      if (r.skipped) {
        std::printf("step %d/%d | skipped: loss %g, gradient norm %g; first non-finite gradient (backward order): "
                    "%s\n", done, cfg.train.steps, r.loss, r.grad_norm, r.first_nonfinite.c_str());
        logger.log_record({{"type", "skip"}, {"step", done}, {"loss", r.loss}, {"grad_norm", r.grad_norm},
                           {"first_nonfinite_gradient", r.first_nonfinite}, {"consecutive", r.consecutive_skips}});
        if (r.consecutive_skips >= cfg.train.max_skipped_steps)
          throw_error("training diverged: %d consecutive steps up to step %d had a non-finite loss or gradient norm "
                      "(last: loss %g, gradient norm %g; first non-finite gradient: %s). Lower train.lr, raise "
                      "train.warmup_steps, keep more layers in BF16 (precision.bf16_layers) or check the data",
                      r.consecutive_skips, done, r.loss, r.grad_norm, r.first_nonfinite.c_str());
      }
      const MemoryReport memory = session.memory_report();
      TrainStepMetrics m;
      m.step = done;
      m.loss = r.loss;
      m.lr = lr;
      m.grad_norm = r.grad_norm;
      m.step_ms = r.seconds * 1e3;
      m.tokens = static_cast<double>(session.tokens_per_step());
      m.mem_gib = memory.peak_bytes / 1073741824.0;
      logger.log_train(m);
      if (step == start_step) logger.log_memory(memory, "first_step");  // every buffer is allocated by now
      if (r.comm.valid)
        logger.log_record({{"type", "comm"}, {"step", done}, {"reduce_ms", r.comm.reduce_ms},
                           {"exposed_reduce_ms", r.comm.exposed_reduce_ms}, {"optimizer_ms", r.comm.optimizer_ms}});
      log_numerics(logger, done, r.numerics);

      const bool last = done == cfg.train.steps;
      if ((cfg.eval.every > 0 && done % cfg.eval.every == 0) || last) run_eval(done);
      if ((cfg.sample.every > 0 && done % cfg.sample.every == 0) || last) run_sample(done);
      if (!cfg.checkpoint.dir.empty() && ((cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0) || last)) {
        const std::string dir = session.save(done);
        if (comm.is_root()) std::printf("checkpoint: %s\n", dir.c_str());
      }
    }
    if (stop_at > start_step) logger.log_memory(session.memory_report(), "end");
    if (stop_at < cfg.train.steps) std::printf("stopped after step %d (--stop-at-step)\n", stop_at);
    comm.barrier("the end of training");
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

int main(int argc, char** argv) {
  llmc::CliOptions options;
  const int rc = llmc::parse_cli(argc, argv, &options);
  if (rc >= 0) return rc;
  try {
    const int world_size = llmc::detect_world_size();
    if (options.print_config || options.dry_run || options.exporting()) {  // no GPU, no launcher needed
      const llmc::RunConfig cfg = llmc::load_config(options.config_path, options.overrides, world_size);
      if (options.print_config) std::printf("%s\n", llmc::config_to_json(cfg).dump(2).c_str());
      if (options.dry_run) {
        std::printf("%s", llmc::dry_run_report(cfg, world_size).c_str());
        const llmc::DryRunChecks checks = llmc::dry_run_checks(cfg);  // data, checkpoint.dir, ...: what a run needs
        for (const std::string& line : checks.passed) std::printf("checked: %s\n", line.c_str());
        if (!checks.problems.empty()) {
          std::string list;
          for (const std::string& problem : checks.problems) list += "\n  - " + problem;
          llmc::throw_error("dry run: the config is valid, but a run would stop at %zu problem(s):%s",
                            checks.problems.size(), list.c_str());
        }
      }
      if (options.print_config || options.dry_run) return 0;
      // the start weights, written in other formats
      return llmc::export_run_weights(cfg, options.export_hf, options.export_llmc,
                                      llmc::parse_weight_dtype(options.export_dtype), options.force);
    }
    const llmc::LaunchInfo launch = llmc::detect_launch();
    llmc::set_error_rank(launch.rank, launch.world_size);
    if (launch.world_size != world_size)
      llmc::throw_error("the launcher variables give %d processes here but %d to the config (a leftover WORLD_SIZE?)",
                        launch.world_size, world_size);
    std::optional<llmc::RunConfig> cfg;
    const std::string config_error = llmc::capture_error(
        [&] { cfg.emplace(llmc::load_config(options.config_path, options.overrides, world_size)); });
    if (!config_error.empty()) {  // tell the other ranks (they stop at once, naming this rank), then stop
      llmc::report_startup_failure(
          launch, llmc::bootstrap_parallel_config(options.config_path, options.overrides), config_error);
      throw llmc::Error(config_error);
    }
    return run_training(*cfg, options, launch);
  } catch (const llmc::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%serror: %s\n", llmc::error_prefix().c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {  // a bug, not a user error: still a message and exit code 1, not an abort
    std::fflush(stdout);
    std::fprintf(stderr, "%serror: internal error: %s\n", llmc::error_prefix().c_str(), e.what());
    return 1;
  }
}
