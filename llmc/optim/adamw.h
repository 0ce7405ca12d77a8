// llmc/optim/adamw.h: AdamW over a list of global element ranges of the flat parameter buffer (the ParamTable layout):
// the FP32 master weights and the moments (in the run's optimizer.state_format, llmc/optim/state_format.h) of those
// ranges, their per-tensor segments (weight decay from the ParamTable), global-norm gradient clipping computed on the
// GPU without a host sync, the update launches that also write the bf16 working copy, and set / restore / download of
// the state. One rank owns one range [0, total) (one GPU, and every rank under ZeRO-0); under ZeRO-1 a rank owns its
// pieces of the shard layout (llmc/distributed/zero.h), which adds only the communication around this class.
//
// Ranges are kept in the order given (the local storage order): local element j of range i sits at the sum of the
// lengths of ranges 0..i-1 plus j in master and in the moments.
//
// The gradient norm is two halves: norm_partials (the fixed-grid squared-norm partials of every range, a range that
// does not add to the norm giving zeros) and clipped_update (the fixed-order sum of whichever partials the caller
// passes, the clip scale, the update). step() passes this state's own partials; ZeRO-1 all-gathers every rank's
// first. With one range [0, total) that is one global_norm_squared over the whole buffer and one global_norm_finish.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/core/param_table.h"
#include "llmc/optim/optimizer_state.h"
#include "llmc/optim/state_format.h"

namespace llmc {

using bf16 = __nv_bfloat16;

// The optimizer section of a run config (llmc/run/config.h documents every key).
struct OptimizerConfig {
  std::string type = "adamw";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;      // applied to 2-D tensors only
  StateFormat state_format = StateFormat::fp32();  // storage of m and v
};

// One global range of the flat buffer whose optimizer state a rank keeps.
struct StateRange {
  ElementRange elements;
  bool adds_to_norm = true;  // false: the range is replicated and another rank adds its gradients to the global norm
};

class AdamW {
 public:
  // Allocates master and the moments of the ranges (master = m = v = 0). llmc::Error naming the optimizer key for
  // invalid hyperparameters, and for ranges that are empty, overlap the end of the buffer or break the alignment the
  // state format needs (StateFormat::shard_alignment).
  AdamW(const ParamTable& table, const OptimizerConfig& config, std::vector<StateRange> ranges);
  // The whole buffer with FP32 moments (one GPU; the model tests and tools).
  AdamW(const ParamTable& table, double beta1, double beta2, double eps, double weight_decay);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // Master weights of the ranges from the host array of the whole table (table.total_elements floats), and
  // params = bf16(master) on the ranges. m, v unchanged. Returns when the host array may be released.
  void set_master(const float* host_full, bf16* params, cudaStream_t s);
  // One step on one rank: the global gradient norm over the ranges (deterministic) -> clip scale
  // min(1, grad_clip / norm) (grad_clip <= 0: no clipping; a non-finite norm skips the update) -> AdamW per segment
  // (weight decay only where ParamInfo::weight_decay) -> params on the ranges. t is the 1-based step count used for
  // bias correction.
  void step(bf16* params, const float* grads, float lr, int t, float grad_clip, cudaStream_t s);
  // The halves of step() for a state spread over ranks (see the top of this file). norm_partials returns the
  // device array of num_norm_partials() floats it wrote; clipped_update sums `count` partials (the same on every
  // rank) into the norm.
  const float* norm_partials(const float* grads, cudaStream_t s);
  size_t num_norm_partials() const;
  void clipped_update(bf16* params, const float* grads, const float* partials, size_t count, float lr, int t,
                      float grad_clip, cudaStream_t s);
  // The gradient norm (before clipping) of the last step (synchronises the stream).
  float last_grad_norm(cudaStream_t s);

  // The state on the host (synchronous): master of the ranges (local order) and the moments as stored.
  void download(std::vector<float>* master, StoredMoments* moments) const;
  // Resume: master weights as set_master, and the moments of the ranges (local order) in this state's format (a
  // checkpoint of another format is converted when read, llmc/io/optimizer_files).
  void restore(const float* master_full, const StoredMoments& moments, bf16* params, cudaStream_t s);

  std::vector<ElementRange> ranges() const;  // in local order
  size_t num_elements() const { return n_; }  // local
  const StateFormat& state_format() const { return format_; }
  const float* master() const { return master_; }  // device (num_elements(), local order)

 private:
  // A contiguous piece of one tensor inside a range, updated with one set of hyperparameters.
  struct Segment {
    size_t global, local, numel;
    bool weight_decay;
  };
  std::vector<StateRange> ranges_;
  std::vector<Segment> segments_;
  size_t n_ = 0;
  StateFormat format_;
  float beta1_, beta2_, eps_, weight_decay_;
  float* master_ = nullptr;      // (n) FP32 master weights
  void* m_ = nullptr;            // format_.m.bytes(n): first moment
  void* v_ = nullptr;            // format_.v.bytes(n): second moment
  float* partials_ = nullptr;    // (ranges * global_norm_partials_per_tensor()) squared-norm partial sums
  float* norm_ = nullptr;        // (1) global gradient norm
  float* grad_scale_ = nullptr;  // (1) clip scale applied to the gradients
};

}  // namespace llmc
