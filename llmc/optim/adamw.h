// llmc/optim/adamw.h: AdamW with FP32 master weights and FP32 moments (single GPU, full state), global-norm gradient
// clipping computed on the GPU without a host sync, and the bf16 working copy written by the update. Every pass goes
// over contiguous element ranges of the flat ParamTable layout, so ZeRO-1 can later run it on a shard's ranges.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "llmc/core/param_table.h"

namespace llmc {

using bf16 = __nv_bfloat16;

// The optimizer section of a run config (llmc/run/config.h documents every key).
struct OptimizerConfig {
  std::string type = "adamw";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;      // applied to 2-D tensors only
};

class AdamW {
 public:
  // Allocates master, m and v (table.total_elements FP32 each; m = v = 0).
  AdamW(const ParamTable& table, double beta1, double beta2, double eps, double weight_decay);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // Uploads the FP32 master weights (host, table.total_elements) and writes params = bf16(master). m, v unchanged.
  void set_master(const float* host, bf16* params, cudaStream_t s);
  // One step: global gradient norm over all tensors (deterministic) -> clip scale min(1, grad_clip / norm)
  // (grad_clip <= 0: no clipping) -> AdamW per tensor (weight decay only where ParamInfo::weight_decay) -> params.
  // t is the 1-based step count used for bias correction.
  void step(bf16* params, const float* grads, float lr, int t, float grad_clip, cudaStream_t s);
  // The gradient norm (before clipping) of the last step (synchronises the stream).
  float last_grad_norm(cudaStream_t s);
  // Full state to / from host arrays of table.total_elements floats each (synchronous).
  void download(float* master, float* m, float* v) const;
  void upload(const float* master, const float* m, const float* v, bf16* params, cudaStream_t s);
  size_t num_elements() const { return n_; }
  const float* master() const { return master_; }  // device (total_elements)

 private:
  // A contiguous element range updated with one set of hyperparameters (one tensor of the table).
  struct Segment {
    size_t offset, numel;
    bool weight_decay;
  };
  std::vector<Segment> segments_;
  size_t n_ = 0;
  float beta1_, beta2_, eps_, weight_decay_;
  float* master_ = nullptr;      // (n) FP32 master weights
  float* m_ = nullptr;           // (n) first moment
  float* v_ = nullptr;           // (n) second moment
  float* partials_ = nullptr;    // (global_norm_partials_per_tensor(),) squared-norm partial sums of the whole buffer
  float* norm_ = nullptr;        // (1) global gradient norm
  float* grad_scale_ = nullptr;  // (1) clip scale applied to the gradients
};

}  // namespace llmc
