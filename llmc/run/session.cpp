// llmc/run/session.cpp: the training session (llmc/run/session.h): construction, the start (resume or initialise),
// one optimizer step, evaluation, sampling, and the one save / restore of a run's state.
#include "llmc/run/session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "llmc/core/common.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/interop.h"
#include "llmc/io/optimizer_files.h"
#include "llmc/io/precision_files.h"
#include "llmc/precision/gemm.h"
#include "llmc/run/start_weights.h"

namespace llmc {

namespace {

// Device memory in use on this process's GPU (the whole GPU: other processes count too).
size_t device_memory_in_use() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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

}  // namespace

TrainingSession::TrainingSession(const RunConfig& cfg, Comm& comm, cudaStream_t stream)
    : cfg_(cfg), comm_(comm), stream_(stream), sample_rng_(static_cast<uint64_t>(cfg.sample.seed)),
      memory_plan_(plan_memory(cfg, comm.world_size())), memory_before_run_(device_memory_in_use()) {
  const int B = cfg.train.micro_batch, T = cfg.train.seq_len;
  const int rank = comm.rank(), world_size = comm.world_size();
  // Data: the loaders check every shard's header and size; with data.check_tokens (the default) every token of every
  // shard is checked against the vocabulary here, before the first step (each rank scans its share, multithreaded);
  // every batch read is checked again. Each rank reads its own slice.
  comm.check_all_ok(capture_error([&] {
                      TokenCheckOptions token_check;
                      token_check.progress = comm.is_root() ? stdout : nullptr;
                      train_.emplace(cfg.data.train, B, T, rank, world_size, cfg.data.shuffle, cfg.data.seed);
                      train_->set_vocab_size(cfg.model.vocab_size);
                      if (cfg.data.check_tokens) train_->check_tokens(cfg.model.vocab_size, token_check);
                      if (!cfg.data.val.empty()) {
                        val_.emplace(cfg.data.val, B, T, rank, world_size, /*shuffle=*/false, cfg.data.seed);
                        val_->set_vocab_size(cfg.model.vocab_size);
                        if (cfg.data.check_tokens) val_->check_tokens(cfg.model.vocab_size, token_check);
                      }
                      if (cfg.sample.tokens > 0 && comm.is_root()) tokenizer_.emplace(cfg.data.tokenizer);
                    }),
                    "loading the data");
  std::printf("data: %zu training tokens in %s (%zu batches per epoch%s)%s\n", train_->total_tokens(),
              cfg.data.train.c_str(), train_->batches_per_epoch(), world_size > 1 ? " per rank" : "",
              val_ ? strformat(", %zu validation tokens", val_->total_tokens()).c_str() : "");

  gemm_init();
  model_ = make_model(cfg.model, B, T, cfg.train.recompute, cfg.precision);
  // Stochastic rounding and random Hadamard signs draw from the run's seed; each rank its own stream.
  model_->precision_state()->set_random_stream(static_cast<uint64_t>(cfg.train.seed), comm.rank(), world_size);
  optimizer_ = std::make_unique<ZeroAdamW>(comm, model_->table(), model_->params(), model_->grads(), cfg.optimizer,
                                           cfg.parallel.zero_stage);
  if (comm.distributed()) {
    // Reduce each block's gradients as soon as backward has finished them; keep delayed scaling equal on all ranks
    // (MAX of the amaxes before the scales are updated).
    ZeroAdamW* opt = optimizer_.get();
    model_->set_grad_ready_hook([opt](int layer, cudaStream_t s) { opt->grads_ready(layer, s); });
    model_->set_amax_reducer([&comm](float* amax, int n, cudaStream_t s) { comm.all_reduce_max_after(amax, n, s); });
  }
  step_inputs_.resize(static_cast<size_t>(cfg.grad_accum_steps) * B * T);
  step_targets_.resize(step_inputs_.size());
  eval_inputs_.resize(static_cast<size_t>(B) * T);
  eval_targets_.resize(eval_inputs_.size());
  memory_peak_ = device_memory_in_use();
  abort_guard_.emplace(comm);
}

TrainingSession::~TrainingSession() {
  abort_guard_.reset();  // first: during an exception it aborts NCCL before the buffers below are freed
  optimizer_.reset();
  model_.reset();
  gemm_shutdown();
}

long long TrainingSession::tokens_per_step() const {
  return static_cast<long long>(cfg_.train.micro_batch) * cfg_.train.seq_len * cfg_.grad_accum_steps *
         comm_.world_size();
}

void TrainingSession::start() {
  // Rank 0 picks and verifies the checkpoint and applies the lineage rules to the run directory (rollbacks, a new
  // run in a directory holding checkpoints: llmc/io/checkpoint.h); every rank loads the checkpoint.
  std::optional<std::string> dir;
  comm_.check_all_ok(capture_error([&] {
                       if (!comm_.is_root()) return;
                       RunStart run = start_run(cfg_.checkpoint.resume, cfg_.checkpoint.dir, cfg_.checkpoint.overwrite);
                       for (const std::string& note : run.notes) std::printf("checkpoint: %s\n", note.c_str());
                       dir = run.resume_dir;
                       lineage_ = std::move(run.lineage);
                     }),
                     "finding the checkpoint to resume from");
  if (const std::string chosen = comm_.broadcast_text(dir.value_or(""), "the checkpoint to resume from");
      !chosen.empty())
    dir = chosen;
  if (!dir) {
    comm_.check_all_ok(capture_error([&] { initialise_weights(); }), "initialising the weights");
    return;
  }
  comm_.check_all_ok(capture_error([&] { restore(*dir); }), "loading the checkpoint");
  std::printf("resumed from %s at step %d\n", dir->c_str(), start_step_);
}

void TrainingSession::initialise_weights() {
  const ParamTable& table = model_->table();
  std::vector<float> master(table.total_elements, 0.0f);
  if (!cfg_.train.init_from.empty()) {  // an llm8 checkpoint (verified), a Hugging Face directory or an llm.c file
    std::printf("init: weights from %s\n", load_init_from(cfg_, master.data()).c_str());
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    init_parameters(table, static_cast<uint64_t>(cfg_.train.seed), master.data());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("init: random weights (train.seed = %d) in %.1f s\n", cfg_.train.seed, seconds);
  }
  optimizer_->set_master(master.data(), stream_);
  model_->weights_changed();
}

void TrainingSession::restore(const std::string& step_dir) {
  const ParamTable& table = model_->table();
  TrainerState state = load_trainer_state(step_dir);
  check_same_model(state, cfg_, step_dir);
  {  // master weights by name, moments from whatever optimizer files it has (re-sharded, converted to this run's
     // optimizer.state_format)
    const OptimizerStateFiles saved =
        read_optimizer_state(step_dir, state, table, optimizer_->owned_ranges(), optimizer_->state_format());
    if (!saved.note.empty()) std::printf("%s\n", saved.note.c_str());
    optimizer_->restore(saved.master_full.data(), saved.moments, stream_);
  }
  model_->weights_changed();
  const nlohmann::json& positions = state.data.at("train");
  if (state.world_size == comm_.world_size()) {
    train_->restore(positions.at(comm_.rank()));
  } else {
    std::string note;
    train_->restore(continue_position(positions.at(0), train_->position(), &note));
    std::printf("resume: checkpoint written by %d rank(s), this run has %d: optimizer state re-sharded; %s\n",
                state.world_size, comm_.world_size(), note.c_str());
  }
  sample_rng_.set_state(std::stoull(state.rng.at("sample").get<std::string>()));
  start_step_ = static_cast<int>(state.step);
  // Checkpoints from before the divergence guard have no update count: every step was applied.
  optimizer_updates_ = state.extra.value("optimizer_updates", static_cast<long long>(state.step));
  skipped_steps_ = state.extra.value("skipped_steps", 0LL);
  PrecisionState* precision = model_->precision_state();
  if (precision && precision->num_slots() > 0) {
    if (!state.extra.contains("precision"))
      throw_error("checkpoint %s has no FP8 scaling state, but precision.recipe = \"%s\" keeps one: resume with the "
                  "recipe it was written with", step_dir.c_str(), cfg_.precision.recipe.c_str());
    read_precision_state(step_dir + "/" + kPrecisionFile, state.extra["precision"], *precision);
  }
  resumed_from_ = step_dir;
}

std::string TrainingSession::save(int step) {
  std::optional<CheckpointWriter> writer;
  comm_.check_all_ok(capture_error([&] {
                       if (comm_.is_root()) writer.emplace(cfg_.checkpoint.dir, step);
                     }),
                     "creating the checkpoint directory");
  const OptimizerSnapshot snapshot = optimizer_->snapshot(stream_);  // collective: rank 0 gathers the master weights
  const std::string tmp = checkpoint_tmp_path(cfg_.checkpoint.dir, step);
  PrecisionState* precision = model_->precision_state();
  const bool has_precision = precision && precision->num_slots() > 0;
  comm_.check_all_ok(capture_error([&] {
                       write_optimizer_snapshot(snapshot, tmp);
                       // The scaling state is the same on every rank (the amax reducer keeps it so): rank 0's.
                       if (has_precision && comm_.is_root()) write_precision_state(tmp + "/" + kPrecisionFile, *precision);
                     }),
                     "writing its checkpoint files");
  const std::vector<std::string> positions = comm_.all_gather_text(train_->position().dump(), "the data positions");
  std::string dir;
  comm_.check_all_ok(capture_error([&] {
                       if (!comm_.is_root()) return;
                       TrainerState state;
                       state.step = step;
                       state.world_size = comm_.world_size();
                       state.rng = {{"sample", std::to_string(sample_rng_.state())}};
                       state.data = {{"train", nlohmann::json::array()}};
                       for (const std::string& p : positions) state.data["train"].push_back(nlohmann::json::parse(p));
                       state.config = config_to_json(cfg_);
                       state.extra = {{"optimizer_updates", optimizer_updates_},
                                      {"skipped_steps", skipped_steps_},
                                      {"optimizer", describe_optimizer_snapshot(snapshot)}};
                       if (has_precision) state.extra["precision"] = precision->describe();
                       std::vector<std::string> notes;
                       dir = writer->commit(state, cfg_.checkpoint.keep, &lineage_, &notes);
                       for (const std::string& note : notes) std::printf("checkpoint: %s\n", note.c_str());
                     }),
                     "committing the checkpoint");
  return dir;
}

StepReport TrainingSession::train_step(int step, double lr, bool measure_numerics) {
  const double t0 = now_seconds();
  const int B = cfg_.train.micro_batch, T = cfg_.train.seq_len, accum = cfg_.grad_accum_steps;
  StepReport r;
  r.step = step + 1;
  PrecisionState* precision = model_->precision_state();
  precision->begin_step(step);  // the random streams of this step's micro-steps (a resumed run draws the same)
  if (measure_numerics) {
    precision->set_product_numerics(cfg_.log.numerics_products);
    precision->request_numerics();
  }
  // The step's data first: a bad shard or token on one rank stops every rank here, naming it.
  comm_.check_all_ok(capture_error([&] {
                       for (int micro = 0; micro < accum; micro++)
                         train_->next_batch(step_inputs_.data() + static_cast<size_t>(micro) * B * T,
                                            step_targets_.data() + static_cast<size_t>(micro) * B * T);
                     }),
                     "reading the training data");
  // The loss gradient is pre-scaled by the global token count, so the sum of the ranks' gradients is the mean.
  const float grad_scale = 1.0f / (static_cast<float>(B) * T * accum * comm_.world_size());
  model_->zero_grads(stream_);
  model_->reset_step_loss(stream_);
  double loss = 0;
  for (int micro = 0; micro < accum; micro++) {
    const bool last_micro = micro == accum - 1;
    optimizer_->begin_micro_step(last_micro);  // the last micro-step reduces the gradients
    model_->forward(step_inputs_.data() + static_cast<size_t>(micro) * B * T,
                    step_targets_.data() + static_cast<size_t>(micro) * B * T, B, T, grad_scale, stream_);
    model_->add_to_step_loss(1.0 / accum, stream_);  // summed on the device: no wait per micro-step
    // Every rank decides on the same (mean) loss; read (the one wait of the micro-steps) and averaged before the
    // last backward queues the gradient reductions, so that this wait does not include them.
    if (last_micro) loss = comm_.average(model_->step_loss(stream_), "the training loss");
    model_->backward(stream_);
    optimizer_->backward_done(stream_);
  }
  // The update. AdamW skips itself on the device when the (global) gradient norm is not finite; a non-finite loss
  // skips it here. Either way the weights, moments and scaling state stay as they were, on every rank.
  double grad_norm = NAN;
  if (std::isfinite(loss)) {
    optimizer_->step(static_cast<float>(lr), static_cast<int>(optimizer_updates_ + 1),
                     static_cast<float>(cfg_.train.grad_clip), stream_);
    grad_norm = optimizer_->last_grad_norm(stream_);  // waits: the step is done on every GPU
  } else {
    optimizer_->skip_step(stream_);
  }
  r.loss = loss;
  r.grad_norm = grad_norm;
  r.skipped = !std::isfinite(loss) || !std::isfinite(grad_norm);
  if (r.skipped) {
    if (precision) precision->discard_step(stream_);
    skipped_steps_++;
    consecutive_skips_++;
    r.first_nonfinite = first_nonfinite_gradient();
  } else {
    consecutive_skips_ = 0;
    optimizer_updates_++;
    model_->end_step(stream_);  // new weights: quantised weight caches are stale; delayed scaling updates its scales
  }
  r.consecutive_skips = consecutive_skips_;
  r.seconds = now_seconds() - t0;
  r.comm = optimizer_->last_comm_times();
  if (measure_numerics && precision) r.numerics = precision->collect_numerics(stream_);
  memory_peak_ = std::max(memory_peak_, device_memory_in_use());
  memory_step_ = r.step;
  return r;
}

MemoryReport TrainingSession::memory_report() const {
  MemoryReport m;
  m.step = memory_step_;
  m.peak_bytes = memory_peak_;
  m.before_run_bytes = memory_before_run_;
  m.estimate_bytes = memory_plan_.total();
  return m;
}

// The first tensor, in backward order (output side first), whose gradient holds a non-finite value. Downloads the
// gradients: only called for a skipped step.
std::string TrainingSession::first_nonfinite_gradient() {
  const ParamTable& table = model_->table();
  std::vector<float> grads(table.total_elements);
  CUDA_CHECK(cudaMemcpy(grads.data(), model_->grads(), grads.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const std::string found = first_nonfinite_element(table, grads.data(), /*output_side_first=*/true);
  return found.empty() ? "none (the loss itself was not finite)" : found;
}

double TrainingSession::evaluate() {
  if (!val_) throw_error("internal error: evaluate() without data.val");
  val_->reset();
  double sum = 0;
  for (int i = 0; i < cfg_.eval.batches; i++) {
    val_->next_batch(eval_inputs_.data(), eval_targets_.data());
    model_->forward(eval_inputs_.data(), eval_targets_.data(), cfg_.train.micro_batch, cfg_.train.seq_len, 0.0f,
                    stream_);
    sum += model_->mean_loss(stream_);
  }
  return comm_.average(sum / cfg_.eval.batches, "the validation loss");
}

std::string TrainingSession::sample() {
  if (!tokenizer_) return "";  // rank 0 samples; the others have no tokenizer
  SampleOptions opt;
  opt.tokens = cfg_.sample.tokens;
  opt.temperature = cfg_.sample.temperature;
  opt.top_k = cfg_.sample.top_k;
  opt.seq_len = cfg_.train.seq_len;
  opt.full_batch = quantizes_linears(cfg_.precision) ? cfg_.train.micro_batch : 0;
  return generate_sample(*model_, *tokenizer_, opt, sample_rng_, stream_);
}

}  // namespace llmc
