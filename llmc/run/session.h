// llmc/run/session.h: the training session, which owns the state of a run: the data loaders (positions), the model
// (weights, gradients, activations, its precision state), the optimizer (master weights, moments, shard layout), the
// sampling RNG, the tokenizer, and the loop counters (applied and skipped optimizer steps). It is the one place that
// knows what a checkpoint holds: save(step) writes all of it and restore(dir) reads all of it back, and it enforces the
// weight-change protocol (after an applied optimizer step the model's quantised weight caches are invalidated and
// delayed scaling advances; after restore or initialisation the caches are invalidated; a skipped step discards what
// it recorded), so the driver (train_gpt.cu) never has to remember when.
//
// Collective calls (every rank calls them, in the same order): the constructor, start, train_step, evaluate, save.
// Rank 0 prints; sample() generates on rank 0 only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "llmc/distributed/comm.h"
#include "llmc/distributed/zero.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/data.h"
#include "llmc/io/tokenizer.h"
#include "llmc/model/model.h"
#include "llmc/precision/precision_state.h"
#include "llmc/run/config.h"
#include "llmc/run/memory_plan.h"
#include "llmc/run/metrics.h"
#include "llmc/run/sampling.h"

namespace llmc {

// What one optimizer step did.
struct StepReport {
  int step = 0;                  // 1-based: optimizer steps done, this one included
  double loss = 0;               // mean training loss over the micro-steps and the ranks
  double grad_norm = 0;          // global gradient norm before clipping (NaN when the step was skipped for its loss)
  double seconds = 0;            // wall time of the step (data, micro-steps, reduction, optimizer)
  bool skipped = false;          // the divergence guard skipped it: nothing was updated
  int consecutive_skips = 0;     // skipped steps in a row up to this one
  std::string first_nonfinite;   // skipped: the first tensor (backward order) whose gradient is not finite
  CommTimes comm;                // data-parallel runs: the gradient reduction's timings
  std::vector<TensorNumerics> numerics;  // quantised tensors' telemetry, when it was requested for this step
};

class TrainingSession {
 public:
  // Loads the data (every rank its slice; an error on any rank stops all of them, naming it), builds the model of
  // cfg.model with the precision recipe and the optimizer over the ranks of comm, and wires the gradient-ready hook
  // and the amax reducer for data parallelism. Weights are not set yet: call start().
  TrainingSession(const RunConfig& cfg, Comm& comm, cudaStream_t stream);
  ~TrainingSession();
  TrainingSession(const TrainingSession&) = delete;
  TrainingSession& operator=(const TrainingSession&) = delete;

  // The run's starting point: the checkpoint checkpoint.resume resolves to (restore), else the weights of
  // train.init_from, else the initialisation from train.seed. Before that, rank 0 applies the lineage rules to
  // checkpoint.dir (start_run: a rollback moves the abandoned line aside; a new run in a directory holding
  // checkpoints stops unless checkpoint.overwrite). Prints what it did.
  void start();
  int start_step() const { return start_step_; }
  const std::optional<std::string>& resumed_from() const { return resumed_from_; }

  // One optimizer step, the 0-based `step` of the run: the step's data (a bad shard or token on one rank stops every
  // rank here), the micro-steps with gradient accumulation, the gradient reduction, AdamW with clipping at learning
  // rate lr, or the divergence guard's skip when the loss or the gradient norm is not finite.
  StepReport train_step(int step, double lr, bool measure_numerics);
  // Mean validation loss over eval.batches micro-batches from the start of every rank's slice, averaged over ranks.
  // Needs data.val.
  double evaluate();
  bool has_validation() const { return val_.has_value(); }
  // A sample of sample.tokens tokens (rank 0; "" elsewhere or when sampling is off).
  std::string sample();

  // The checkpoint of `step` (optimizer steps done) in checkpoint.dir: model and optimizer state, precision state,
  // data positions, RNG, loop counters, the resolved config. Returns the step directory (rank 0; "" elsewhere).
  std::string save(int step);
  // Everything save() wrote, from a step directory written by any number of ranks (the optimizer state is re-sharded
  // and the data continues where the saved ranks stopped when the world size differs).
  void restore(const std::string& step_dir);

  Model& model() { return *model_; }
  const DataLoader& train_data() const { return *train_; }
  const std::optional<DataLoader>& val_data() const { return val_; }
  long long tokens_per_step() const;
  // The device memory of this rank: the plan of the run (llmc/run/memory_plan.h) and what was measured up to the last
  // step (cudaMemGetInfo before the session allocated anything, and its peak at the end of every step).
  const MemoryPlan& memory_plan() const { return memory_plan_; }
  MemoryReport memory_report() const;
  long long optimizer_updates() const { return optimizer_updates_; }

 private:
  void initialise_weights();
  std::string first_nonfinite_gradient();

  const RunConfig& cfg_;
  Comm& comm_;
  cudaStream_t stream_;
  std::optional<DataLoader> train_, val_;
  std::optional<GPT2Tokenizer> tokenizer_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ZeroAdamW> optimizer_;
  SampleRng sample_rng_;
  std::vector<int> step_inputs_, step_targets_;  // (accum, B, T) host tokens of one optimizer step
  std::vector<int> eval_inputs_, eval_targets_;  // (B, T)
  int start_step_ = 0;
  std::optional<std::string> resumed_from_;
  RunLineage lineage_;  // rank 0: the run id and parent its checkpoints record, what retention must keep
  MemoryPlan memory_plan_;
  size_t memory_before_run_ = 0;  // device memory in use when the constructor started
  size_t memory_peak_ = 0;        // the most in use at the end of a step (and after the constructor)
  int memory_step_ = 0;           // the last step measured
  long long optimizer_updates_ = 0;  // applied AdamW steps: the bias-correction count (skipped steps do not count)
  long long skipped_steps_ = 0;      // steps the divergence guard skipped, in total
  int consecutive_skips_ = 0;
  // Last member: destroyed first, so an exception that unwinds the session aborts NCCL before the model's and the
  // optimizer's buffers are freed (no cudaFree waits for a collective no peer will finish).
  std::optional<Comm::AbortGuard> abort_guard_;
};

}  // namespace llmc
