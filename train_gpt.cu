// train_gpt: the run driver. Read it top to bottom:
//   flags (llmc/cli) → config (llmc/config: presets, --set overrides, validation) → --print-config / --dry-run
//   → run_training: device → data loaders → model (llmc/model: the architecture of model.arch, its linears planned by
//   the precision recipe, llmc/recipe) + AdamW (llmc/optimizer) → init or resume (llmc/checkpoint) → the training
//   loop (micro-batches with gradient accumulation, AdamW with clipping, the LR schedule, the divergence guard that
//   skips non-finite steps) → validation, samples, FP8 numerics telemetry, checkpoints and logs (llmc/metrics).
// One process trains on one GPU; multi-GPU data parallelism arrives with llmc/comm.
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

#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/common.h"
#include "llmc/config.h"
#include "llmc/data.h"
#include "llmc/gemm.h"
#include "llmc/interop.h"
#include "llmc/linear.h"
#include "llmc/model.h"
#include "llmc/metrics.h"
#include "llmc/optimizer.h"
#include "llmc/safetensors.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"

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

// Mean validation loss over cfg.eval.batches micro-batches from the start of the validation data.
double evaluate(Model& model, DataLoader& val, const RunConfig& cfg, std::vector<int>& inputs,
                std::vector<int>& targets, cudaStream_t stream) {
  val.reset();
  double sum = 0;
  for (int i = 0; i < cfg.eval.batches; i++) {
    val.next_batch(inputs.data(), targets.data());
    model.forward(inputs.data(), targets.data(), cfg.train.micro_batch, cfg.train.seq_len, 0.0f, stream);
    sum += model.mean_loss(stream);
  }
  return sum / cfg.eval.batches;
}

// ------------------------------------------------------------------------------------------------------------------
// Checkpoints: model.safetensors = FP32 master weights by parameter name (the bf16 working weights are their
// round-to-nearest copies), optimizer_m/v.safetensors = AdamW moments, trainer_state.json = step, RNG, data position.
const char* kModelFile = "model.safetensors";
const char* kMomentFiles[2] = {"optimizer_m.safetensors", "optimizer_v.safetensors"};

void write_tensor_file(const std::string& path, const ParamTable& table, const std::vector<float>& values,
                       const std::string& content) {
  SafetensorsWriter writer;
  for (const ParamInfo& p : table.params)
    writer.add(p.name, "F32", p.shape, values.data() + p.offset, p.numel * sizeof(float));
  writer.set_metadata("format", "llm8");
  writer.set_metadata("content", content);
  writer.write(path);
}

void read_tensor_file(const std::string& path, const ParamTable& table, std::vector<float>& values) {
  SafetensorsReader reader(path);
  for (const ParamInfo& p : table.params) {
    const TensorEntry& e = reader.entry(p.name);
    if (e.dtype != "F32" || e.shape != p.shape)
      throw_error("%s: tensor '%s' is %s with %zu dims; the model needs F32 of the shape in its parameter table "
                  "(is this checkpoint from another model config?)",
                  path.c_str(), p.name.c_str(), e.dtype.c_str(), e.shape.size());
    reader.read_into(p.name, values.data() + p.offset, p.numel * sizeof(float));
  }
}

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

void save_checkpoint(const RunConfig& cfg, int step, Model& model, const AdamW& opt, const DataLoader& train,
                     const SampleRng& rng, const LoopState& loop) {
  const ParamTable& table = model.table();
  std::vector<float> master(table.total_elements), m(table.total_elements), v(table.total_elements);
  opt.download(master.data(), m.data(), v.data());
  CheckpointWriter writer(cfg.checkpoint.dir, step);
  write_tensor_file(writer.file_path(kModelFile), table, master, "fp32 master weights");
  write_tensor_file(writer.file_path(kMomentFiles[0]), table, m, "adamw first moment, fp32");
  write_tensor_file(writer.file_path(kMomentFiles[1]), table, v, "adamw second moment, fp32");
  TrainerState state;
  state.step = step;
  state.world_size = 1;
  state.rng = {{"sample", std::to_string(rng.state)}};
  state.data = {{"train", nlohmann::json::array({train.position()})}};
  state.config = config_to_json(cfg);
  state.extra = {{"optimizer_updates", loop.optimizer_updates}, {"skipped_steps", loop.skipped_steps}};
  if (PrecisionState* p = model.precision_state(); p && p->num_slots() > 0) {
    write_precision_state(writer.file_path(kPrecisionFile), *p);
    state.extra["precision"] = p->describe();
  }
  std::printf("checkpoint: %s\n", writer.commit(state, cfg.checkpoint.keep).c_str());
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
int run_training(const RunConfig& cfg, const CliOptions& options) {
  // Device: one GPU per process; this build runs on one process.
  if (cuda_device_count() == 0)
    throw_error("no CUDA GPU found: training needs an NVIDIA GPU (compute capability 8.0 or newer); use --dry-run to "
                "check a config without one");
  const int world_size = detect_world_size();
  if (world_size != 1)
    throw_error("the launcher asks for %d processes, but this build trains on one GPU per run (multi-GPU data "
                "parallelism is not in this build yet): start one process", world_size);
  const int device = 0;
  CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  print_device(device, prop);
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

  // Data: the loaders check every shard's header and size, and every token against the vocabulary.
  DataLoader train_data(cfg.data.train, B, T, /*rank=*/0, world_size, cfg.data.shuffle, cfg.data.seed);
  train_data.set_vocab_size(spec.vocab_size);
  std::optional<DataLoader> val_data;
  if (!cfg.data.val.empty()) {
    val_data.emplace(cfg.data.val, B, T, 0, world_size, /*shuffle=*/false, cfg.data.seed);
    val_data->set_vocab_size(spec.vocab_size);
  }
  std::optional<GPT2Tokenizer> tokenizer;
  if (cfg.sample.tokens > 0) tokenizer.emplace(cfg.data.tokenizer);
  std::printf("data: %zu training tokens in %s (%zu batches per epoch)%s\n", train_data.total_tokens(),
              cfg.data.train.c_str(), train_data.batches_per_epoch(),
              val_data ? strformat(", %zu validation tokens", val_data->total_tokens()).c_str() : "");

  // Model and optimizer.
  gemm_init();
  std::unique_ptr<Model> model_ptr = make_model(spec, B, T, cfg.train.recompute, cfg.precision);
  Model& model = *model_ptr;
  AdamW optimizer(model.table(), cfg.optimizer.beta1, cfg.optimizer.beta2, cfg.optimizer.eps,
                  cfg.optimizer.weight_decay);
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
  std::printf("batch: %d x %d tokens, %d accumulation steps, %s tokens per step\n", B, T, accum,
              with_thousands(tokens_per_step).c_str());

  // Initial state: resume from a checkpoint, or initialise (randomly or from train.init_from).
  int start_step = 0;
  LoopState loop;
  SampleRng sample_rng(cfg.sample.seed);
  std::vector<std::string> notes;
  std::optional<std::string> resume_dir;
  if (!cfg.checkpoint.dir.empty() || (cfg.checkpoint.resume != "auto" && cfg.checkpoint.resume != "none"))
    resume_dir = resolve_resume(cfg.checkpoint.resume, cfg.checkpoint.dir, &notes);
  for (const std::string& note : notes) std::printf("checkpoint: %s\n", note.c_str());
  if (resume_dir) {
    TrainerState state = load_trainer_state(*resume_dir);
    check_world_size(state, world_size, *resume_dir);
    check_same_model(state, cfg, *resume_dir);
    std::vector<float> master(table.total_elements, 0.0f), m(table.total_elements, 0.0f),
        v(table.total_elements, 0.0f);
    read_tensor_file(*resume_dir + "/" + kModelFile, table, master);
    read_tensor_file(*resume_dir + "/" + kMomentFiles[0], table, m);
    read_tensor_file(*resume_dir + "/" + kMomentFiles[1], table, v);
    optimizer.upload(master.data(), m.data(), v.data(), model.params(), stream);
    model.weights_changed();
    train_data.restore(state.data.at("train").at(0));
    sample_rng.state = std::stoull(state.rng.at("sample").get<std::string>());
    start_step = static_cast<int>(state.step);
    // Checkpoints from before the divergence guard have no update count: every step was applied.
    loop.optimizer_updates = state.extra.value("optimizer_updates", static_cast<long long>(state.step));
    loop.skipped_steps = state.extra.value("skipped_steps", 0LL);
    PrecisionState* precision = model.precision_state();
    if (precision && precision->num_slots() > 0) {
      if (!state.extra.contains("precision"))
        throw_error("checkpoint %s has no FP8 scaling state, but precision.recipe = \"%s\" keeps one: resume with "
                    "the recipe it was written with", resume_dir->c_str(), cfg.precision.recipe.c_str());
      read_precision_state(*resume_dir + "/" + kPrecisionFile, state.extra["precision"], *precision);
    }
    std::printf("resumed from %s at step %d\n", resume_dir->c_str(), start_step);
  } else {
    std::vector<float> master(table.total_elements, 0.0f);
    if (!cfg.train.init_from.empty()) {  // an llm8 checkpoint, a Hugging Face directory or an llm.c model file
      std::printf("init: weights from %s\n", load_weights(cfg.train.init_from, spec, master.data()).c_str());
    } else {
      init_parameters(table, static_cast<uint64_t>(cfg.train.seed), master.data());
    }
    optimizer.set_master(master.data(), model.params(), stream);
    model.weights_changed();
  }
  if (start_step >= cfg.train.steps)
    std::printf("nothing to do: the checkpoint is at step %d and train.steps = %d\n", start_step, cfg.train.steps);

  // Logging.
  GpuPeaks peaks{0, 0};
  const bool known_gpu = gpu_peaks(prop.name, &peaks);
  MetricsOptions mopt;
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
  auto run_eval = [&](int step) {
    if (!val_data) return;
    const double val_loss = evaluate(model, *val_data, cfg, inputs, targets, stream);
    logger.log_eval(step, val_loss);  // prints "step S/N | val loss L" and writes the JSONL record
  };
  auto run_sample = [&](int step) {
    if (!tokenizer) return;
    const std::string text = generate_sample(model, cfg, *tokenizer, sample_rng, stream);
    logger.log_sample(step, text);  // prints "step S/N | sample:" and the text, writes the JSONL record
  };

  // The training loop. `step` counts completed optimizer steps.
  const float grad_scale = 1.0f / (static_cast<float>(B) * T * accum);
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
    model.zero_grads(stream);
    double loss = 0;
    for (int micro = 0; micro < accum; micro++) {
      train_data.next_batch(inputs.data(), targets.data());
      model.forward(inputs.data(), targets.data(), B, T, grad_scale, stream);
      model.backward(stream);
      loss += model.mean_loss(stream) / accum;
    }
    // The update. AdamW skips itself on the device when the gradient norm is not finite; a non-finite loss skips
    // it here. Either way the weights, moments and FP8 scales stay as they were.
    double grad_norm = NAN;
    if (std::isfinite(loss)) {
      optimizer.step(model.params(), model.grads(), static_cast<float>(lr), static_cast<int>(loop.optimizer_updates + 1),
                     static_cast<float>(cfg.train.grad_clip), stream);
      grad_norm = optimizer.last_grad_norm(stream);  // synchronises: the step is done
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
    if (measure_numerics) log_numerics(logger, done, precision->collect_numerics(stream));

    const bool last = done == cfg.train.steps;
    if ((cfg.eval.every > 0 && done % cfg.eval.every == 0) || last) run_eval(done);
    if ((cfg.sample.every > 0 && done % cfg.sample.every == 0) || last) run_sample(done);
    if (!cfg.checkpoint.dir.empty() &&
        ((cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0) || last))
      save_checkpoint(cfg, done, model, optimizer, train_data, sample_rng, loop);
  }
  if (stop_at < cfg.train.steps) std::printf("stopped after step %d (--stop-at-step)\n", stop_at);

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
    const llmc::RunConfig cfg = llmc::load_config(options.config_path, options.overrides, world_size);
    if (options.print_config) std::printf("%s\n", llmc::config_to_json(cfg).dump(2).c_str());
    if (options.dry_run) std::printf("%s", llmc::dry_run_report(cfg, world_size).c_str());
    if (options.print_config || options.dry_run) return 0;
    if (options.exporting())  // no GPU needed: the start weights, written in other formats
      return llmc::export_run_weights(cfg, options.export_hf, options.export_llmc,
                                      llmc::parse_weight_dtype(options.export_dtype));
    return run_training(cfg, options);
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
