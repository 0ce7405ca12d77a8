// train_gpt: the run driver. Read it top to bottom:
//   flags (llmc/run/cli) → config (llmc/run/config: presets, --set overrides, validation) → --print-config / --dry-run
//   → run_training: process group (llmc/distributed/comm: one process per GPU; nothing for one GPU) → device → data loaders
//   → model (llmc/model/model: the architecture of model.arch, its linears planned by the precision recipe, llmc/precision/recipe)
//   + AdamW (llmc/distributed/zero: ZeRO-1 / ZeRO-0 over the ranks, llmc/optim/adamw's AdamW on one GPU) → init or resume
//   (llmc/io/checkpoint) → the training loop (micro-batches with gradient accumulation, the gradient reduction during
//   the last backward, AdamW with clipping, the LR schedule, the divergence guard that skips non-finite steps)
//   → validation, samples, FP8 numerics telemetry, checkpoints and logs (llmc/run/metrics). Rank 0 prints and writes
//   logs; every rank checks in at the check points (data, resume, each step's data, checkpoints), so that an error on
//   one rank stops all of them with a message naming it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/io/checkpoint.h"
#include "llmc/run/cli.h"
#include "llmc/distributed/comm.h"
#include "llmc/distributed/rendezvous.h"
#include "llmc/core/common.h"
#include "llmc/run/config.h"
#include "llmc/io/data.h"
#include "llmc/precision/gemm.h"
#include "llmc/io/interop.h"
#include "llmc/io/optimizer_files.h"
#include "llmc/precision/linear.h"
#include "llmc/model/model.h"
#include "llmc/run/metrics.h"
#include "llmc/run/start_weights.h"
#include "llmc/optim/adamw.h"
#include "llmc/io/safetensors.h"
#include "llmc/optim/schedule.h"
#include "llmc/io/tokenizer.h"
#include "llmc/distributed/zero.h"

namespace {

using namespace llmc;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ------------------------------------------------------------------------------------------------------------------
// Sampling: an explicit RNG (xorshift64*) whose whole state is one integer, so checkpoints carry it.
struct SampleRng {
  uint64_t state;
  explicit SampleRng(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next_u64() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Dull;
  }
  double next_unit() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
};

// Draws a token from logits (V) with temperature and top-k (0 = the whole vocabulary).
int sample_token(const std::vector<float>& logits, double temperature, int top_k, SampleRng& rng) {
  const int V = static_cast<int>(logits.size());
  std::vector<int> idx(V);
  for (int i = 0; i < V; i++) idx[i] = i;
  const int k = (top_k > 0 && top_k < V) ? top_k : V;
  if (k < V)
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  double max_logit = -INFINITY;
  for (int i = 0; i < k; i++) max_logit = std::max(max_logit, static_cast<double>(logits[idx[i]]));
  std::vector<double> weights(k);
  double total = 0;
  for (int i = 0; i < k; i++) total += weights[i] = std::exp((logits[idx[i]] - max_logit) / temperature);
  const double u = rng.next_unit() * total;
  double acc = 0;
  for (int i = 0; i < k; i++) {
    acc += weights[i];
    if (u < acc) return idx[i];
  }
  return idx[k - 1];
}

// Generates cfg.sample.tokens tokens after <|endoftext|> with the training forward (the same kernels, precision and
// quantisers), re-running it over the context (at most seq_len tokens) for each new token. FP8 GEMMs need the rows
// to be a multiple of 16 / 128, so an FP8 model runs the training batch shape (B, T) with the context in row 0
// followed by <|endoftext|> padding, which causal attention keeps from influencing the positions before it.
std::string generate_sample(Model& model, const RunConfig& cfg, const GPT2Tokenizer& tokenizer, SampleRng& rng,
                            cudaStream_t stream) {
  const int V = cfg.model.vocab_size, Vp = cfg.model.padded_vocab_size;
  const bool full_batch = cfg.precision.fp8;
  std::vector<int> context{tokenizer.eot_token()}, generated, batch;
  std::vector<bf16> row(V);
  std::vector<float> logits(V);
  for (int i = 0; i < cfg.sample.tokens; i++) {
    const int start = std::max(0, static_cast<int>(context.size()) - cfg.train.seq_len);
    const int T = static_cast<int>(context.size()) - start;
    if (full_batch) {
      batch.assign(static_cast<size_t>(cfg.train.micro_batch) * cfg.train.seq_len, tokenizer.eot_token());
      std::copy(context.begin() + start, context.end(), batch.begin());
      model.forward(batch.data(), nullptr, cfg.train.micro_batch, cfg.train.seq_len, 0.0f, stream);
    } else {
      model.forward(context.data() + start, nullptr, 1, T, 0.0f, stream);
    }
    CUDA_CHECK(cudaMemcpyAsync(row.data(), model.logits() + static_cast<size_t>(T - 1) * Vp, V * sizeof(bf16),
                               cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int v = 0; v < V; v++) logits[v] = __bfloat162float(row[v]);
    const int next = sample_token(logits, cfg.sample.temperature, cfg.sample.top_k, rng);
    context.push_back(next);
    generated.push_back(next);
  }
  return tokenizer.decode(generated);
}

// Mean validation loss over cfg.eval.batches micro-batches from the start of every rank's slice of the validation
// data, averaged over the ranks.
double evaluate(Model& model, DataLoader& val, const RunConfig& cfg, std::vector<int>& inputs,
                std::vector<int>& targets, Comm& comm, cudaStream_t stream) {
  val.reset();
  double sum = 0;
  for (int i = 0; i < cfg.eval.batches; i++) {
    val.next_batch(inputs.data(), targets.data());
    model.forward(inputs.data(), targets.data(), cfg.train.micro_batch, cfg.train.seq_len, 0.0f, stream);
    sum += model.mean_loss(stream);
  }
  return comm.average(sum / cfg.eval.batches, "the validation loss");
}

// ------------------------------------------------------------------------------------------------------------------
// Checkpoints (file formats in llmc/distributed/zero.h): model.safetensors = FP32 master weights by parameter name (the bf16
// working weights are their round-to-nearest copies), the AdamW state (optimizer_m/v.safetensors by name on one GPU
// and under ZeRO-0, one optimizer_rank%05d.safetensors per rank under ZeRO-1), trainer_state.json = step, RNG, every
// rank's data position, world size and shard layout. Rank 0 creates the tmp dir and commits; every rank writes its
// files into it between the two; the check points make sure nothing is committed unless every rank succeeded.

// precision_state.safetensors: the FP8 scaling state of delayed scaling ("scales" = scale | scale_inv per slot,
// "amax_history" (slots, history_len)); its description (slot names, ring position) goes into trainer_state.json.
const char* kPrecisionFile = "precision_state.safetensors";

void write_precision_state(const std::string& path, const PrecisionState& p) {
  std::vector<float> scales, history;
  p.download(&scales, &history);
  SafetensorsWriter writer;
  writer.add("scales", "F32", {static_cast<int64_t>(scales.size())}, scales.data(), scales.size() * sizeof(float));
  writer.add("amax_history", "F32", {static_cast<int64_t>(history.size())}, history.data(),
             history.size() * sizeof(float));
  writer.set_metadata("format", "llm8");
  writer.set_metadata("content", "fp8 scaling state");
  writer.write(path);
}

void read_precision_state(const std::string& path, const nlohmann::json& description, PrecisionState& p) {
  SafetensorsReader reader(path);
  std::vector<float> scales(reader.entry("scales").nbytes / sizeof(float)),
      history(reader.entry("amax_history").nbytes / sizeof(float));
  reader.read_into("scales", scales.data(), scales.size() * sizeof(float));
  reader.read_into("amax_history", history.data(), history.size() * sizeof(float));
  p.upload(description, scales, history);
}

// What the training loop carries across checkpoints besides weights and moments.
struct LoopState {
  long long optimizer_updates = 0;  // applied AdamW steps (the bias-correction count; skipped steps do not count)
  long long skipped_steps = 0;      // steps the divergence guard skipped, in total
};

void save_checkpoint(const RunConfig& cfg, int step, Model& model, ZeroAdamW& opt, const DataLoader& train,
                     const SampleRng& rng, const LoopState& loop, Comm& comm, cudaStream_t stream) {
  std::optional<CheckpointWriter> writer;
  comm.check_all_ok(capture_error([&] { if (comm.is_root()) writer.emplace(cfg.checkpoint.dir, step); }),
                    "creating the checkpoint directory");
  const OptimizerSnapshot snapshot = opt.snapshot(stream);  // collective: rank 0 gathers the master weights
  const std::string tmp = checkpoint_tmp_path(cfg.checkpoint.dir, step);
  PrecisionState* precision = model.precision_state();
  const bool has_precision = precision && precision->num_slots() > 0;
  comm.check_all_ok(capture_error([&] {
                      write_optimizer_snapshot(snapshot, tmp);
                      // The FP8 scaling state is the same on every rank (the amax reducer keeps it so): rank 0's.
                      if (has_precision && comm.is_root()) write_precision_state(tmp + "/" + kPrecisionFile, *precision);
                    }),
                    "writing its checkpoint files");
  const std::vector<std::string> positions = comm.all_gather_text(train.position().dump(), "the data positions");
  std::string dir;
  comm.check_all_ok(capture_error([&] {
                      if (!comm.is_root()) return;
                      TrainerState state;
                      state.step = step;
                      state.world_size = comm.world_size();
                      state.rng = {{"sample", std::to_string(rng.state)}};
                      state.data = {{"train", nlohmann::json::array()}};
                      for (const std::string& p : positions) state.data["train"].push_back(nlohmann::json::parse(p));
                      state.config = config_to_json(cfg);
                      state.extra = {{"optimizer_updates", loop.optimizer_updates},
                                     {"skipped_steps", loop.skipped_steps},
                                     {"optimizer", describe_optimizer_snapshot(snapshot)}};
                      if (has_precision) state.extra["precision"] = precision->describe();
                      dir = writer->commit(state, cfg.checkpoint.keep);
                    }),
                    "committing the checkpoint");
  if (comm.is_root()) std::printf("checkpoint: %s\n", dir.c_str());
}

// The model section of a checkpoint's config must equal this run's: the tensors would not fit otherwise.
void check_same_model(const TrainerState& state, const RunConfig& cfg, const std::string& dir) {
  const nlohmann::json saved = state.config.value("model", nlohmann::json::object());
  const nlohmann::json now = config_to_json(cfg)["model"];
  for (auto it = now.begin(); it != now.end(); ++it)
    if (it.key() != "preset" && saved.contains(it.key()) && saved[it.key()] != it.value())
      throw_error("checkpoint %s was written for model.%s = %s but this config has %s: resume with the same model "
                  "(or set checkpoint.resume to \"none\" / use another checkpoint.dir)",
                  dir.c_str(), it.key().c_str(), saved[it.key()].dump().c_str(), it.value().dump().c_str());
}

// The divergence guard's diagnosis: the first tensor, in backward order (output side first), whose gradient holds a
// non-finite value. Downloads the gradients: only called for a skipped step.
std::string first_nonfinite_gradient(Model& model) {
  const ParamTable& table = model.table();
  std::vector<float> grads(table.total_elements);
  CUDA_CHECK(cudaMemcpy(grads.data(), model.grads(), grads.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (auto it = table.params.rbegin(); it != table.params.rend(); ++it) {
    const float* g = grads.data() + it->offset;
    for (size_t i = 0; i < it->numel; i++)
      if (!std::isfinite(g[i])) return strformat("%s (element %zu = %g)", it->name.c_str(), i, g[i]);
  }
  return "none (the loss itself was not finite)";
}

// FP8 numerics telemetry: one JSONL record per quantised tensor.
void log_numerics(MetricsLogger& logger, int step, const std::vector<TensorNumerics>& numerics) {
  auto finite_or_null = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  double worst_snr = INFINITY;
  std::string worst;
  for (const TensorNumerics& t : numerics) {
    logger.log_record({{"type", "numerics"}, {"step", step}, {"tensor", t.name},
                       {"amax", finite_or_null(t.stats.amax)}, {"scale", finite_or_null(t.stats.scale)},
                       {"saturated_frac", t.stats.saturated_frac}, {"underflow_frac", t.stats.underflow_frac},
                       {"snr_db", finite_or_null(t.stats.snr_db)}});
    if (t.stats.snr_db < worst_snr) {
      worst_snr = t.stats.snr_db;
      worst = t.name;
    }
  }
  if (!numerics.empty())
    std::printf("step %d | numerics: %zu FP8 tensors, lowest SNR %.1f dB (%s)\n", step, numerics.size(), worst_snr,
                worst.c_str());
}

void print_device(int device, const cudaDeviceProp& prop) {
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
}

double device_memory_in_use_gib() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return (total_bytes - free_bytes) / 1073741824.0;
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// The training run. Returns the exit code; throws llmc::Error for user-facing problems.
int run_training(const RunConfig& cfg, const CliOptions& options, const LaunchInfo& launch) {
  // Process group: with several processes, every rank joins (rendezvous, NCCL) and picks the GPU of its local rank;
  // one process needs nothing. Only rank 0 prints (LLM8_ALL_RANKS_PRINT=1 keeps every rank's output).
  Comm comm(launch, cfg.parallel);
  const int world_size = comm.world_size(), rank = comm.rank();
  quiet_stdout_unless(comm.is_root() || std::getenv("LLM8_ALL_RANKS_PRINT"));
  if (cuda_device_count() == 0)
    throw_error("no CUDA GPU found: training needs an NVIDIA GPU (compute capability 8.0 or newer); use --dry-run to "
                "check a config without one");
  const int device = comm.device();
  CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  print_device(device, prop);
  if (comm.distributed())
    std::printf("parallel: %d ranks (%s, init %s), ZeRO stage %d\n", world_size, launch.launcher.c_str(),
                comm.method().c_str(), cfg.parallel.zero_stage);
  const int need_cc = recipe_min_compute_capability(cfg.precision);
  if (prop.major * 10 + prop.minor < need_cc)
    throw_error("precision.recipe = \"%s\" needs compute capability %d.%d or newer (%s); %s is sm_%d%d",
                cfg.precision.recipe.c_str(), need_cc / 10, need_cc % 10,
                need_cc >= 90 ? "block-scaled FP8 GEMMs need Hopper" : need_cc >= 89 ? "FP8 tensor cores" :
                "bf16 tensor cores", prop.name, prop.major, prop.minor);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));

  const ModelSpec& spec = cfg.model;
  const int B = cfg.train.micro_batch, T = cfg.train.seq_len, accum = cfg.grad_accum_steps;
  const long long tokens_per_step = static_cast<long long>(B) * T * accum * world_size;

  // Data: the loaders check every shard's header and size; with data.check_tokens (the default) every token of every
  // shard is checked against the vocabulary here, before the first step (each rank scans its share, multithreaded);
  // every batch read is checked again. Each rank reads its own slice. A problem on any rank stops every rank here.
  std::optional<DataLoader> train_loader, val_data;
  std::optional<GPT2Tokenizer> tokenizer;
  comm.check_all_ok(capture_error([&] {
                      TokenCheckOptions token_check;
                      token_check.progress = comm.is_root() ? stdout : nullptr;
                      train_loader.emplace(cfg.data.train, B, T, rank, world_size, cfg.data.shuffle, cfg.data.seed);
                      train_loader->set_vocab_size(spec.vocab_size);
                      if (cfg.data.check_tokens) train_loader->check_tokens(spec.vocab_size, token_check);
                      if (!cfg.data.val.empty()) {
                        val_data.emplace(cfg.data.val, B, T, rank, world_size, /*shuffle=*/false, cfg.data.seed);
                        val_data->set_vocab_size(spec.vocab_size);
                        if (cfg.data.check_tokens) val_data->check_tokens(spec.vocab_size, token_check);
                      }
                      if (cfg.sample.tokens > 0 && comm.is_root()) tokenizer.emplace(cfg.data.tokenizer);
                    }),
                    "loading the data");
  DataLoader& train_data = *train_loader;
  std::printf("data: %zu training tokens in %s (%zu batches per epoch%s)%s\n", train_data.total_tokens(),
              cfg.data.train.c_str(), train_data.batches_per_epoch(), world_size > 1 ? " per rank" : "",
              val_data ? strformat(", %zu validation tokens", val_data->total_tokens()).c_str() : "");

  // Model and optimizer.
  gemm_init();
  std::unique_ptr<Model> model_ptr = make_model(spec, B, T, cfg.train.recompute, cfg.precision);
  Model& model = *model_ptr;
  ZeroAdamW optimizer(comm, model.table(), model.params(), model.grads(), cfg.optimizer, cfg.parallel.zero_stage);
  if (comm.distributed()) {
    // Reduce each block's gradients as soon as backward has finished them; keep FP8 delayed scaling equal on all
    // ranks (MAX of the amaxes before the scales are updated).
    model.set_grad_ready_hook([&optimizer](int layer, cudaStream_t s) { optimizer.grads_ready(layer, s); });
    model.set_amax_reducer([&comm](float* amax, int n, cudaStream_t s) { comm.all_reduce_max_after(amax, n, s); });
  }
  // From here on an exception aborts NCCL before the buffers above are freed (no cudaFree waits for a peer).
  const Comm::AbortGuard abort_guard(comm);
  const ParamTable& table = model.table();
  std::printf("model: %s, %s parameters (%s with the padded vocabulary)\n", spec.arch.c_str(),
              with_thousands(count_parameters(spec, false)).c_str(),
              with_thousands(count_parameters(spec, true)).c_str());
  std::printf("precision: %s\n", describe_recipe(cfg.precision).c_str());
  const PrecisionState* fp8_state = model.precision_state();
  std::printf("memory: activations %.1f MiB for %d x %d tokens%s\n", model.activation_bytes() / 1048576.0, B, T,
              fp8_state && cfg.precision.fp8
                  ? strformat(", FP8 weight copies, saved inputs and scratch %.1f MiB",
                              fp8_state->device_bytes() / 1048576.0).c_str()
                  : "");
  std::printf("batch: %d x %d tokens x %d GPU%s, %d accumulation steps, %s tokens per step\n", B, T, world_size,
              world_size > 1 ? "s" : "", accum, with_thousands(tokens_per_step).c_str());

  // Initial state: resume from a checkpoint (written by any number of ranks: the optimizer state is re-sharded), or
  // initialise (randomly or from train.init_from). Rank 0 picks and verifies the checkpoint; every rank loads it.
  int start_step = 0;
  LoopState loop;
  SampleRng sample_rng(cfg.sample.seed);
  std::optional<std::string> resume_dir;
  comm.check_all_ok(capture_error([&] {
                      if (!comm.is_root()) return;
                      std::vector<std::string> notes;
                      if (!cfg.checkpoint.dir.empty() ||
                          (cfg.checkpoint.resume != "auto" && cfg.checkpoint.resume != "none"))
                        resume_dir = resolve_resume(cfg.checkpoint.resume, cfg.checkpoint.dir, &notes);
                      for (const std::string& note : notes) std::printf("checkpoint: %s\n", note.c_str());
                    }),
                    "finding the checkpoint to resume from");
  if (const std::string dir = comm.broadcast_text(resume_dir.value_or(""), "the checkpoint to resume from");
      !dir.empty())
    resume_dir = dir;
  comm.check_all_ok(capture_error([&] {
                      if (!resume_dir) {
                        std::vector<float> master(table.total_elements, 0.0f);
                        if (!cfg.train.init_from.empty()) {  // an llm8 checkpoint, a Hugging Face directory or
                                                             // an llm.c model file
                          std::printf("init: weights from %s\n",
                                      load_weights(cfg.train.init_from, spec, master.data()).c_str());
                        } else {
                          init_parameters(table, static_cast<uint64_t>(cfg.train.seed), master.data());
                        }
                        optimizer.set_master(master.data(), stream);
                        model.weights_changed();
                        return;
                      }
                      TrainerState state = load_trainer_state(*resume_dir);
                      check_same_model(state, cfg, *resume_dir);
                      {  // master weights by name, moments from whatever optimizer files it has (re-sharded)
                        const OptimizerStateFiles saved =
                            read_optimizer_state(*resume_dir, state, table, optimizer.owned_ranges());
                        optimizer.restore(saved.master_full.data(), saved.m, saved.v, stream);
                      }
                      model.weights_changed();
                      const nlohmann::json& saved = state.data.at("train");
                      if (state.world_size == world_size) {
                        train_data.restore(saved.at(rank));
                      } else {
                        std::string note;
                        train_data.restore(continue_position(saved.at(0), train_data.position(), &note));
                        std::printf("resume: checkpoint written by %d rank(s), this run has %d: optimizer state "
                                    "re-sharded; %s\n", state.world_size, world_size, note.c_str());
                      }
                      sample_rng.state = std::stoull(state.rng.at("sample").get<std::string>());
                      start_step = static_cast<int>(state.step);
                      // Checkpoints from before the divergence guard have no update count: every step was applied.
                      loop.optimizer_updates = state.extra.value("optimizer_updates", static_cast<long long>(state.step));
                      loop.skipped_steps = state.extra.value("skipped_steps", 0LL);
                      PrecisionState* precision = model.precision_state();
                      if (precision && precision->num_slots() > 0) {
                        if (!state.extra.contains("precision"))
                          throw_error("checkpoint %s has no FP8 scaling state, but precision.recipe = \"%s\" keeps "
                                      "one: resume with the recipe it was written with", resume_dir->c_str(),
                                      cfg.precision.recipe.c_str());
                        read_precision_state(*resume_dir + "/" + kPrecisionFile, state.extra["precision"],
                                             *precision);
                      }
                    }),
                    resume_dir ? "loading the checkpoint" : "initialising the weights");
  if (resume_dir) std::printf("resumed from %s at step %d\n", resume_dir->c_str(), start_step);
  if (start_step >= cfg.train.steps)
    std::printf("nothing to do: the checkpoint is at step %d and train.steps = %d\n", start_step, cfg.train.steps);

  // Logging.
  GpuPeaks peaks{0, 0};
  const bool known_gpu = gpu_peaks(prop.name, &peaks);
  MetricsOptions mopt;
  mopt.writer = comm.is_root();
  mopt.jsonl_path = !cfg.log.jsonl.empty() ? cfg.log.jsonl
                    : !cfg.checkpoint.dir.empty() ? cfg.checkpoint.dir + "/metrics.jsonl" : "";
  mopt.append = resume_dir.has_value();
  mopt.total_steps = cfg.train.steps;
  mopt.console_every = cfg.log.every;
  mopt.flops_per_token = flops_per_token(spec, T);
  mopt.peak_tflops = known_gpu ? peaks.bf16_tflops : 0;
  mopt.world_size = world_size;
  MetricsLogger logger(mopt);
  if (resume_dir) logger.log_record({{"type", "resume"}, {"step", start_step}, {"from", *resume_dir}});

  std::vector<int> inputs(static_cast<size_t>(B) * T), targets(static_cast<size_t>(B) * T);
  std::vector<int> step_inputs(static_cast<size_t>(accum) * B * T), step_targets(step_inputs.size());
  auto run_eval = [&](int step) {
    if (!val_data) return;
    const double val_loss = evaluate(model, *val_data, cfg, inputs, targets, comm, stream);
    logger.log_eval(step, val_loss);  // prints "step S/N | val loss L" and writes the JSONL record
  };
  auto run_sample = [&](int step) {
    if (!tokenizer) return;  // rank 0 samples; the others have no tokenizer
    const std::string text = generate_sample(model, cfg, *tokenizer, sample_rng, stream);
    logger.log_sample(step, text);  // prints "step S/N | sample:" and the text, writes the JSONL record
  };

  // The training loop. `step` counts completed optimizer steps. The loss gradient is pre-scaled by the global token
  // count, so the sum of the ranks' gradients (the reduction) is the mean.
  const float grad_scale = 1.0f / (static_cast<float>(B) * T * accum * world_size);
  double peak_mem_gib = device_memory_in_use_gib();
  int stop_at = cfg.train.steps;
  if (options.stop_at_step > 0) stop_at = std::min(stop_at, options.stop_at_step);
  if (start_step == 0 && cfg.eval.every > 0) run_eval(0);
  PrecisionState* precision = model.precision_state();
  const bool telemetry = cfg.log.numerics_every > 0 && precision != nullptr && cfg.precision.fp8;
  int consecutive_skips = 0;
  for (int step = start_step; step < stop_at; step++) {
    const double t0 = now_seconds();
    const double lr = learning_rate(cfg.train.schedule, step, cfg.train.steps, cfg.train.warmup_steps, cfg.train.lr,
                                    cfg.train.final_lr_frac, cfg.train.wsd_decay_frac);
    const int done = step + 1;
    const bool measure_numerics = telemetry && done % cfg.log.numerics_every == 0;
    if (measure_numerics) precision->request_numerics();
    // The step's data first: a bad shard or token on one rank stops every rank here, naming it.
    comm.check_all_ok(capture_error([&] {
                        for (int micro = 0; micro < accum; micro++)
                          train_data.next_batch(step_inputs.data() + static_cast<size_t>(micro) * B * T,
                                                step_targets.data() + static_cast<size_t>(micro) * B * T);
                      }),
                      "reading the training data");
    model.zero_grads(stream);
    model.reset_step_loss(stream);
    double loss = 0;
    for (int micro = 0; micro < accum; micro++) {
      const int* micro_inputs = step_inputs.data() + static_cast<size_t>(micro) * B * T;
      const int* micro_targets = step_targets.data() + static_cast<size_t>(micro) * B * T;
      const bool last_micro = micro == accum - 1;
      optimizer.begin_micro_step(last_micro);  // the last micro-step reduces the gradients
      model.forward(micro_inputs, micro_targets, B, T, grad_scale, stream);
      model.add_to_step_loss(1.0 / accum, stream);  // summed on the device: no wait per micro-step
      // Every rank decides on the same (mean) loss; read (the one wait of the micro-steps) and averaged before the
      // last backward queues the gradient reductions, so that this wait does not include them.
      if (last_micro) loss = comm.average(model.step_loss(stream), "the training loss");
      model.backward(stream);
      optimizer.backward_done(stream);
    }
    // The update. AdamW skips itself on the device when the (global) gradient norm is not finite; a non-finite loss
    // skips it here. Either way the weights, moments and FP8 scales stay as they were, on every rank.
    double grad_norm = NAN;
    if (std::isfinite(loss)) {
      optimizer.step(static_cast<float>(lr), static_cast<int>(loop.optimizer_updates + 1),
                     static_cast<float>(cfg.train.grad_clip), stream);
      grad_norm = optimizer.last_grad_norm(stream);  // waits: the step is done on every GPU
    } else {
      optimizer.skip_step(stream);
    }
    const bool skipped = !std::isfinite(loss) || !std::isfinite(grad_norm);
    if (skipped) {
      if (precision) precision->discard_step(stream);
      loop.skipped_steps++;
      consecutive_skips++;
      const std::string culprit = first_nonfinite_gradient(model);
      std::printf("step %d/%d | skipped: loss %g, gradient norm %g; first non-finite gradient (backward order): %s\n",
                  done, cfg.train.steps, loss, grad_norm, culprit.c_str());
      logger.log_record({{"type", "skip"}, {"step", done}, {"loss", loss}, {"grad_norm", grad_norm},
                         {"first_nonfinite_gradient", culprit}, {"consecutive", consecutive_skips}});
      if (consecutive_skips >= cfg.train.max_skipped_steps)
        throw_error("training diverged: %d consecutive steps up to step %d had a non-finite loss or gradient norm "
                    "(last: loss %g, gradient norm %g; first non-finite gradient: %s). Lower train.lr, raise "
                    "train.warmup_steps, keep more layers in BF16 (precision.bf16_layers) or check the data",
                    consecutive_skips, done, loss, grad_norm, culprit.c_str());
    } else {
      consecutive_skips = 0;
      loop.optimizer_updates++;
      model.end_step(stream);  // new weights: FP8 weight caches are stale; delayed scaling updates its scales
    }
    const double t1 = now_seconds();
    peak_mem_gib = std::max(peak_mem_gib, device_memory_in_use_gib());

    TrainStepMetrics m;
    m.step = done;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = grad_norm;
    m.step_ms = (t1 - t0) * 1e3;
    m.tokens = static_cast<double>(tokens_per_step);
    m.mem_gib = peak_mem_gib;
    logger.log_train(m);
    if (const CommTimes c = optimizer.last_comm_times(); c.valid)
      logger.log_record({{"type", "comm"}, {"step", done}, {"reduce_ms", c.reduce_ms},
                         {"exposed_reduce_ms", c.exposed_reduce_ms}, {"optimizer_ms", c.optimizer_ms}});
    if (measure_numerics) log_numerics(logger, done, precision->collect_numerics(stream));

    const bool last = done == cfg.train.steps;
    if ((cfg.eval.every > 0 && done % cfg.eval.every == 0) || last) run_eval(done);
    if ((cfg.sample.every > 0 && done % cfg.sample.every == 0) || last) run_sample(done);
    if (!cfg.checkpoint.dir.empty() &&
        ((cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0) || last))
      save_checkpoint(cfg, done, model, optimizer, train_data, sample_rng, loop, comm, stream);
  }
  if (stop_at < cfg.train.steps) std::printf("stopped after step %d (--stop-at-step)\n", stop_at);

  comm.barrier("the end of training");
  gemm_shutdown();
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
      if (options.dry_run) std::printf("%s", llmc::dry_run_report(cfg, world_size).c_str());
      if (options.print_config || options.dry_run) return 0;
      // the start weights, written in other formats
      return llmc::export_run_weights(cfg, options.export_hf, options.export_llmc,
                                      llmc::parse_weight_dtype(options.export_dtype));
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
