// llmc/distributed/zero.h: AdamW under data parallelism. This module owns what is distributed about the optimizer:
//   - the shard layout: how the flat FP32 gradient buffer (the ParamTable layout) is cut into reduction ranges and
//     which piece of each range every rank owns (make_shard_layout; a pure function, CPU-tested);
//   - the gradient reduction, started from the model's grad-ready hook during the last micro-step's backward on the
//     communication stream (events order it after the gradients it reads), so that it overlaps with the rest of
//     the backward pass;
//   - around the optimizer step: ZeRO-1 (parallel.zero_stage = 1: each rank's llmc/optim AdamW keeps the master
//     weights and moments of its pieces only; the norm partials of all ranks are all-gathered before the update, and
//     the bf16 weights after it into every rank's params()) or ZeRO-0 (zero_stage = 0: gradients all-reduced, every
//     rank runs the AdamW of the whole buffer);
//   - the communication timings, and the gather of the master weights for a checkpoint (snapshot; the files are
//     llmc/io/optimizer_files).
// The optimizer state itself (allocation in the run's optimizer.state_format, segments, norm, update, set / restore /
// download) is llmc/optim/adamw's AdamW over the ranges this rank owns. World size 1 is that AdamW over [0, total) on
// the compute stream: no communication, the same kernels, the same bits (the single-GPU trainer's losses are
// unchanged by this module).
//
// Layout. M = world_size * align elements, align = lcm(kAlign, the state format's shard_alignment()) (kAlign = 32:
// 128 bytes of FP32; 128 for the grouped formats fp8 and fp8_expand, so every piece holds whole groups of 128). The buffer [0, total) is split into
// ranges whose ends are multiples of M, cut near the start of every run of same-block tensors (rounded so that the
// few elements around a cut go to the range that becomes final later), plus a replicated tail
// [replicated_begin, total) shorter than M. Rank r owns, in every range [b, e), the piece [b + r c, b + (r+1) c) with
// c = (e - b) / world_size, so NCCL's reduce-scatter (equal counts) produces exactly the owned pieces, in place in the
// gradient buffer, and the all-gather of the bf16 weights is in place too. The tail is all-reduced and updated by
// every rank (it holds at most M - 1 elements of the last tensors). A range is reduced as soon as every block whose
// gradients it holds has reported final (Model::set_grad_ready_hook), in descending memory order; the embeddings and
// the ranges they share are reduced at the end of backward. Pieces are multiples of align elements.
//
// Gradient averaging: the trainer pre-scales the loss gradient by 1 / (B * T * accum * world_size) (grad_scale of
// Model::forward), so the FP32 NCCL sum over ranks is already the mean; no division afterwards.
//
// Gradient-norm clipping under ZeRO-1: every rank computes the sums of squares of its pieces with the fixed-grid
// partial sums of llmc/kernels/ (kNormBlocks per piece; the replicated tail by rank 0 only), the partials of all
// ranks are all-gathered, and every rank sums all of them in the same fixed order: the same norm on every rank,
// run after run. With 2 ranks the gradient sums are bit-identical to ZeRO-0's all-reduce, so ZeRO-0 and ZeRO-1 give
// bit-identical losses when clipping is off (the norms then differ only in the summation order).
//
// Communication time (last_comm_times): CUDA events on the communication stream around every reduction (their sum is
// reduce_ms, the time NCCL spent, waits for slower ranks included), one on the compute stream at the end of
// backward; exposed_reduce_ms = time from the end of backward to the end of the last reduction (what the step waits
// for), hidden = reduce_ms - exposed_reduce_ms. optimizer_ms = from the end of the reductions to the end of the
// weight all-gather (norm, AdamW, all-gather; not overlapped).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "llmc/distributed/comm.h"
#include "llmc/optim/adamw.h"
#include "llmc/optim/optimizer_state.h"

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// The shard layout

struct ReduceRange {
  size_t begin = 0, end = 0;  // multiples of world_size * ShardLayout::align
  std::vector<int> layers;    // blocks whose gradients it holds, ascending; -1 = tensors outside the blocks
};

struct ShardLayout {
  static constexpr size_t kAlign = 32;
  size_t align = kAlign;  // element alignment of every piece: lcm(kAlign, the state format's shard alignment)
  int world_size = 1;
  size_t total = 0;              // ParamTable::total_elements
  size_t replicated_begin = 0;   // [replicated_begin, total): all-reduced, updated on every rank
  std::vector<ReduceRange> ranges;  // ascending, disjoint, tiling [0, replicated_begin)

  size_t chunk(size_t i) const { return (ranges[i].end - ranges[i].begin) / static_cast<size_t>(world_size); }
  // The global pieces `rank` holds optimizer state for, in its local storage order: its piece of every range, then
  // the replicated tail (when not empty).
  std::vector<ElementRange> owned(int rank) const;
  size_t owned_elements(int rank) const;
  nlohmann::json to_json() const;
};

// Throws llmc::Error for world_size < 1. state_alignment: StateFormat::shard_alignment() of the run's state format (1
// for the element-wise formats: the layout of every build before the grouped formats).
ShardLayout make_shard_layout(const ParamTable& table, int world_size, size_t state_alignment = 1);


// ------------------------------------------------------------------------------------------------------------------
// The optimizer

struct CommTimes {
  bool valid = false;
  double reduce_ms = 0;          // sum of the reductions' durations on the communication stream
  double exposed_reduce_ms = 0;  // end of backward -> end of the last reduction (0 when fully hidden)
  double optimizer_ms = 0;       // norm + AdamW + weight all-gather on the communication stream
};


class ZeroAdamW {
 public:
  // params / grads: the model's flat buffers (table.total_elements each); they must stay where they are.
  // opt.state_format is the storage of this rank's moments.
  ZeroAdamW(Comm& comm, const ParamTable& table, bf16* params, float* grads, const OptimizerConfig& opt,
            int zero_stage);
  ~ZeroAdamW();
  ZeroAdamW(const ZeroAdamW&) = delete;
  ZeroAdamW& operator=(const ZeroAdamW&) = delete;

  int zero_stage() const { return stage_; }  // as run: 0 when world size is 1
  const ShardLayout& layout() const { return layout_; }
  const StateFormat& state_format() const { return state_->state_format(); }

  // Gradient reduction, per micro-step: begin_micro_step(last) before the forward; the model's grad-ready hook calls
  // grads_ready(layer, s) during backward; backward_done(s) after it reduces whatever the hook has not (everything
  // for a model without the hook). Only the last micro-step of an optimizer step reduces.
  void begin_micro_step(bool last);
  void grads_ready(int layer, cudaStream_t s);
  void backward_done(cudaStream_t s);

  // The optimizer step (after backward_done of the last micro-step): clipping by the global norm, AdamW, new bf16
  // weights in params on every rank. Queued; the compute stream s waits for it before its next work.
  void step(float lr, int t, float grad_clip, cudaStream_t s);
  // Instead of step() when the step is skipped (the divergence guard: a non-finite loss on every rank): the weights
  // and moments stay; the compute stream s waits for the reductions already queued before it touches the gradients.
  void skip_step(cudaStream_t s);
  // The gradient norm (before clipping) of the last step: waits for the step (with parallel.timeout_s).
  float last_grad_norm(cudaStream_t s);
  // After last_grad_norm: the communication times of that step (valid = false for world size 1).
  CommTimes last_comm_times();

  // Initial weights: host FP32 master weights of the whole table (params = bf16 of them). Local, no communication.
  void set_master(const float* host_full, cudaStream_t s);
  // The global element ranges this rank keeps optimizer state for, in its local storage order (the whole buffer for
  // world size 1 and ZeRO-0).
  std::vector<ElementRange> owned_ranges() const { return state_->ranges(); }
  // Resume: the full FP32 master weights (host, the whole table) and this rank's moments for owned_ranges(),
  // concatenated, in state_format() (llmc/io/optimizer_files reads and converts them from any checkpoint). Local, no
  // communication.
  void restore(const float* master_full, const StoredMoments& moments, cudaStream_t s);
  // Copies the state to the host; collective (rank 0 gathers the master weights of every rank under ZeRO-1).
  OptimizerSnapshot snapshot(cudaStream_t s);

 private:
  void launch_reductions(cudaStream_t s, bool all);
  void upload_params_from(const float* host_full, cudaStream_t s);

  Comm& comm_;
  const ParamTable& table_;
  bf16* params_;
  float* grads_;
  int stage_ = 0;
  ShardLayout layout_;
  std::unique_ptr<AdamW> state_;  // the master weights and moments of owned_ranges(), and the update

  // reduction bookkeeping
  bool armed_ = false, reduced_ = false;
  std::vector<bool> launched_;
  bool tail_launched_ = false;
  std::vector<bool> layer_done_;  // per block
  bool end_done_ = false;         // hook(-1) seen

  float* all_partials_ = nullptr;  // ZeRO-1: (world * state_->num_norm_partials()) every rank's norm partials

  // timing (world size > 1)
  std::vector<cudaEvent_t> range_start_, range_end_;
  cudaEvent_t backward_end_ = nullptr, reduce_done_ = nullptr, step_done_ = nullptr;
  bool timed_ = false;
};

}  // namespace llmc
