// llmc/distributed/zero.cpp: the shard layout, the reduction schedule and the ZeRO-0 / ZeRO-1 AdamW step (design in
// llmc/distributed/zero.h).
#include "llmc/distributed/zero.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "llmc/core/common.h"
#include "llmc/kernels/reduce.h"

using json = nlohmann::json;

namespace llmc {

// ------------------------------------------------------------------------------------------------------------------
// Layout

std::vector<ElementRange> ShardLayout::owned(int rank) const {
  if (rank < 0 || rank >= world_size) throw_error("shard layout: rank %d is out of range (world size %d)", rank,
                                                  world_size);
  std::vector<ElementRange> out;
  for (size_t i = 0; i < ranges.size(); i++) {
    const size_t c = chunk(i), b = ranges[i].begin + static_cast<size_t>(rank) * c;
    out.push_back({b, b + c});
  }
  if (replicated_begin < total) out.push_back({replicated_begin, total});
  return out;
}

size_t ShardLayout::owned_elements(int rank) const {
  size_t n = 0;
  for (const ElementRange& r : owned(rank)) n += r.second - r.first;
  return n;
}

json ShardLayout::to_json() const {
  json r = json::array();
  for (const ReduceRange& range : ranges) r.push_back({range.begin, range.end});
  return json{{"align", align},
              {"world_size", world_size},
              {"total_elements", total},
              {"replicated", {replicated_begin, total}},
              {"ranges", r},
              {"rule", "rank r owns [b + r*c, b + (r+1)*c) of every range [b, e), c = (e - b) / world_size, and the "
                       "replicated tail"}};
}

ShardLayout make_shard_layout(const ParamTable& table, int world_size, size_t state_alignment) {
  if (world_size < 1) throw_error("shard layout: world size %d must be >= 1", world_size);
  if (state_alignment < 1) throw_error("internal error: shard layout: state alignment %zu", state_alignment);
  ShardLayout L;
  L.align = std::lcm(ShardLayout::kAlign, state_alignment);
  L.world_size = world_size;
  L.total = table.total_elements;
  const size_t M = static_cast<size_t>(world_size) * L.align;
  L.replicated_begin = L.total / M * M;

  // Runs of consecutive tensors of the same block, in memory order.
  std::vector<const ParamInfo*> params;
  for (const ParamInfo& p : table.params) params.push_back(&p);
  std::sort(params.begin(), params.end(), [](const ParamInfo* a, const ParamInfo* b) { return a->offset < b->offset; });
  struct Run {
    size_t begin;
    int layer;
  };
  std::vector<Run> runs;
  for (const ParamInfo* p : params)
    if (runs.empty() || runs.back().layer != p->layer) runs.push_back({p->offset, p->layer});

  // Backward finishes the blocks from the last to the first and the tensors outside the blocks at the very end:
  // "finished earlier" = larger block index, -1 last. The elements between a cut and the exact run boundary go to
  // the side that finishes later, so no range waits for a block that finishes after its neighbour.
  auto finished_earlier = [](int a, int b) { return a > b; };  // -1 compares as the latest
  std::set<size_t> cuts = {0, L.replicated_begin};
  for (size_t i = 1; i < runs.size(); i++) {
    const size_t boundary = runs[i].begin;
    const size_t cut = finished_earlier(runs[i].layer, runs[i - 1].layer) ? round_up(boundary, M) : boundary / M * M;
    cuts.insert(std::min(cut, L.replicated_begin));
  }
  const std::vector<size_t> points(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < points.size(); i++) {
    ReduceRange r;
    r.begin = points[i];
    r.end = points[i + 1];
    if (r.begin >= r.end) continue;
    std::set<int> layers;
    for (const ParamInfo* p : params)
      if (p->offset < r.end && p->offset + p->numel > r.begin) layers.insert(p->layer);
    if (layers.empty()) layers.insert(-1);  // alignment gaps only: no block to wait for; reduce at the end
    r.layers.assign(layers.begin(), layers.end());
    L.ranges.push_back(r);
  }
  return L;
}

// ------------------------------------------------------------------------------------------------------------------
// The optimizer

namespace {

// The state ranges of `rank`: the whole buffer (ZeRO-0 and one rank), or its pieces of the layout (ZeRO-1), the
// replicated tail adding to the norm on rank 0 only.
std::vector<StateRange> state_ranges(const ShardLayout& layout, int rank, int stage) {
  if (stage == 0) return {{{0, layout.total}, true}};
  std::vector<StateRange> out;
  for (const ElementRange& piece : layout.owned(rank))
    out.push_back({piece, piece.first != layout.replicated_begin || rank == 0});
  return out;
}

}  // namespace

ZeroAdamW::ZeroAdamW(Comm& comm, const ParamTable& table, bf16* params, float* grads, const OptimizerConfig& opt,
                     int zero_stage)
    : comm_(comm), table_(table), params_(params), grads_(grads) {
  if (zero_stage != 0 && zero_stage != 1)
    throw_error("parallel.zero_stage = %d: this build has ZeRO stages 0 (replicated optimizer) and 1 (sharded)",
                zero_stage);
  stage_ = comm.distributed() ? zero_stage : 0;
  layout_ = make_shard_layout(table, comm.world_size(), opt.state_format.shard_alignment());
  int blocks = 0;
  for (const ParamInfo& p : table.params) blocks = std::max(blocks, p.layer + 1);
  layer_done_.assign(static_cast<size_t>(blocks), false);
  launched_.assign(layout_.ranges.size(), false);

  state_ = std::make_unique<AdamW>(table, opt, state_ranges(layout_, comm.rank(), stage_));
  if (stage_ == 1)
    CUDA_CHECK(cudaMalloc(&all_partials_, state_->num_norm_partials() * comm.world_size() * sizeof(float)));
  if (comm.distributed()) {
    range_start_.resize(layout_.ranges.size() + 1);
    range_end_.resize(layout_.ranges.size() + 1);
    for (size_t i = 0; i <= layout_.ranges.size(); i++) {
      CUDA_CHECK(cudaEventCreate(&range_start_[i]));
      CUDA_CHECK(cudaEventCreate(&range_end_[i]));
    }
    CUDA_CHECK(cudaEventCreate(&backward_end_));
    CUDA_CHECK(cudaEventCreate(&reduce_done_));
    CUDA_CHECK(cudaEventCreate(&step_done_));
  }
}

ZeroAdamW::~ZeroAdamW() {
  for (cudaEvent_t e : range_start_) cudaEventDestroy(e);
  for (cudaEvent_t e : range_end_) cudaEventDestroy(e);
  for (cudaEvent_t e : {backward_end_, reduce_done_, step_done_})
    if (e) cudaEventDestroy(e);
  if (all_partials_) cudaFree(all_partials_);
}

void ZeroAdamW::begin_micro_step(bool last) {
  if (!comm_.distributed()) return;
  armed_ = last;
  if (!last) return;
  std::fill(launched_.begin(), launched_.end(), false);
  std::fill(layer_done_.begin(), layer_done_.end(), false);
  end_done_ = tail_launched_ = reduced_ = false;
}

void ZeroAdamW::grads_ready(int layer, cudaStream_t s) {
  if (!armed_) return;
  if (layer == -1) {
    end_done_ = true;
  } else if (layer >= 0 && static_cast<size_t>(layer) < layer_done_.size()) {
    layer_done_[static_cast<size_t>(layer)] = true;
  } else {
    throw_error("internal error: the model reported gradients of block %d, but the parameter table has %zu blocks",
                layer, layer_done_.size());
  }
  launch_reductions(s, /*all=*/false);
}

void ZeroAdamW::launch_reductions(cudaStream_t s, bool all) {
  cudaStream_t cs = comm_.stream();
  bool ordered = false;
  auto order_after_compute = [&]() {
    if (!ordered) comm_.comm_waits_for(s);  // one event for everything launched now
    ordered = true;
  };
  for (size_t k = layout_.ranges.size(); k-- > 0;) {
    if (launched_[k]) continue;
    const ReduceRange& r = layout_.ranges[k];
    if (!all && !std::all_of(r.layers.begin(), r.layers.end(), [&](int l) {
          return l < 0 ? end_done_ : static_cast<bool>(layer_done_[static_cast<size_t>(l)]);
        }))
      continue;
    order_after_compute();
    CUDA_CHECK(cudaEventRecord(range_start_[k], cs));
    if (stage_ == 1)
      comm_.reduce_scatter(grads_ + r.begin, layout_.chunk(k), DType::F32);
    else
      comm_.all_reduce(grads_ + r.begin, r.end - r.begin, DType::F32, ReduceOp::Sum);
    CUDA_CHECK(cudaEventRecord(range_end_[k], cs));
    launched_[k] = true;
  }
  if (!tail_launched_ && (all || end_done_)) {
    const size_t k = layout_.ranges.size();
    order_after_compute();
    CUDA_CHECK(cudaEventRecord(range_start_[k], cs));
    comm_.all_reduce(grads_ + layout_.replicated_begin, layout_.total - layout_.replicated_begin, DType::F32,
                     ReduceOp::Sum);
    CUDA_CHECK(cudaEventRecord(range_end_[k], cs));
    tail_launched_ = true;
  }
}

void ZeroAdamW::backward_done(cudaStream_t s) {
  if (!armed_) return;
  launch_reductions(s, /*all=*/true);
  CUDA_CHECK(cudaEventRecord(backward_end_, s));
  CUDA_CHECK(cudaEventRecord(reduce_done_, comm_.stream()));
  armed_ = false;
  reduced_ = true;
}

void ZeroAdamW::step(float lr, int t, float grad_clip, cudaStream_t s) {
  if (!comm_.distributed()) {
    state_->step(params_, grads_, lr, t, grad_clip, s);
    return;
  }
  if (!reduced_)
    throw_error("internal error: ZeroAdamW::step before the gradients were reduced (call begin_micro_step(true) "
                "before the last micro-step and backward_done after its backward)");
  cudaStream_t cs = comm_.stream();
  if (stage_ == 0) {
    state_->step(params_, grads_, lr, t, grad_clip, cs);
  } else {
    const size_t count = state_->num_norm_partials();
    comm_.all_gather(state_->norm_partials(grads_, cs), all_partials_, count, DType::F32);
    state_->clipped_update(params_, grads_, all_partials_, count * comm_.world_size(), lr, t, grad_clip, cs);
    for (size_t k = 0; k < layout_.ranges.size(); k++)
      comm_.all_gather(params_ + layout_.ranges[k].begin, layout_.chunk(k), DType::BF16);
  }
  CUDA_CHECK(cudaEventRecord(step_done_, cs));
  comm_.waits_for_comm(s);
  reduced_ = false;
  timed_ = true;
}

void ZeroAdamW::skip_step(cudaStream_t s) {
  if (!comm_.distributed()) return;
  comm_.waits_for_comm(s);
  reduced_ = false;
  timed_ = false;  // no optimizer timings for this step
}

float ZeroAdamW::last_grad_norm(cudaStream_t s) {
  if (!comm_.distributed()) return state_->last_grad_norm(s);
  cudaStream_t cs = comm_.stream();
  comm_.wait(cs, "the optimizer step (gradient reduction, AdamW, weight all-gather)");
  return state_->last_grad_norm(cs);  // the stream is idle: the copy cannot wait for a peer
}

CommTimes ZeroAdamW::last_comm_times() {
  CommTimes t;
  if (!comm_.distributed() || !timed_) return t;
  auto elapsed = [](cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CUDA_CHECK(cudaEventSynchronize(a));  // recorded before the step's wait: complete, or about to be
    CUDA_CHECK(cudaEventSynchronize(b));
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return static_cast<double>(ms);
  };
  for (size_t k = 0; k <= layout_.ranges.size(); k++)
    if (k < layout_.ranges.size() || layout_.replicated_begin < layout_.total)
      t.reduce_ms += elapsed(range_start_[k], range_end_[k]);
  t.exposed_reduce_ms = std::max(0.0, elapsed(backward_end_, reduce_done_));
  t.optimizer_ms = elapsed(reduce_done_, step_done_);
  t.valid = true;
  return t;
}

void ZeroAdamW::upload_params_from(const float* host_full, cudaStream_t s) {
  const size_t total = table_.total_elements, piece = std::min<size_t>(total, size_t(1) << 24);
  float* tmp = nullptr;
  CUDA_CHECK(cudaMalloc(&tmp, piece * sizeof(float)));
  for (size_t o = 0; o < total; o += piece) {
    const size_t n = std::min(piece, total - o);
    CUDA_CHECK(cudaMemcpyAsync(tmp, host_full + o, n * sizeof(float), cudaMemcpyHostToDevice, s));
    convert_float_to_bf16(params_ + o, tmp, n, s);
    CUDA_CHECK(cudaStreamSynchronize(s));  // tmp is reused by the next piece
  }
  CUDA_CHECK(cudaFree(tmp));
}

void ZeroAdamW::set_master(const float* host_full, cudaStream_t s) {
  if (stage_ == 1) upload_params_from(host_full, s);  // the weights of the pieces other ranks own
  state_->set_master(host_full, params_, s);
}

void ZeroAdamW::restore(const float* master_full, const StoredMoments& moments, cudaStream_t s) {
  if (stage_ == 1) upload_params_from(master_full, s);
  state_->restore(master_full, moments, params_, s);
}

OptimizerSnapshot ZeroAdamW::snapshot(cudaStream_t s) {
  OptimizerSnapshot snap;
  snap.table = &table_;
  snap.rank = comm_.rank();
  snap.world_size = comm_.world_size();
  snap.zero_stage = stage_;
  const size_t total = table_.total_elements;
  if (comm_.distributed()) comm_.wait(comm_.stream(), "the last optimizer step before the checkpoint");
  snap.moments.format = state_->state_format();
  if (stage_ == 0) {
    snap.kind = "full";
    if (comm_.rank() == 0) state_->download(&snap.master_full, &snap.moments);  // the state is the whole buffer
    return snap;
  }
  snap.kind = "sharded";
  snap.owned = state_->ranges();
  snap.layout = layout_.to_json();
  state_->download(&snap.master, &snap.moments);
  const float* master = state_->master();

  // Rank 0 gathers every rank's master pieces (point to point, in bounded pieces) for model.safetensors.
  const int world = comm_.world_size(), rank = comm_.rank();
  size_t max_chunk = 0;
  for (size_t k = 0; k < layout_.ranges.size(); k++) max_chunk = std::max(max_chunk, layout_.chunk(k));
  const size_t piece = std::min<size_t>(std::max<size_t>(max_chunk, 1), size_t(1) << 22);
  float* dev = nullptr;
  float* host = nullptr;
  if (rank == 0) {
    snap.master_full.assign(total, 0.0f);
    CUDA_CHECK(cudaMalloc(&dev, piece * world * sizeof(float)));
    CUDA_CHECK(cudaMallocHost(&host, piece * world * sizeof(float)));
  }
  cudaStream_t cs = comm_.stream();
  std::string failure = capture_error([&]() {
    size_t lo = 0;
    for (size_t k = 0; k < layout_.ranges.size(); k++) {
      const size_t c = layout_.chunk(k), b = layout_.ranges[k].begin;
      for (size_t o = 0; o < c; o += piece) {
        const size_t len = std::min(piece, c - o);
        comm_.group_start();
        if (rank == 0) {
          for (int r = 1; r < world; r++) comm_.recv(dev + static_cast<size_t>(r) * len, len, DType::F32, r);
        } else {
          comm_.send(master + lo + o, len, DType::F32, 0);
        }
        comm_.group_end();
        if (rank == 0) {
          CUDA_CHECK(cudaMemcpyAsync(dev, master + lo + o, len * sizeof(float), cudaMemcpyDeviceToDevice, cs));
          CUDA_CHECK(cudaMemcpyAsync(host, dev, len * world * sizeof(float), cudaMemcpyDeviceToHost, cs));
        }
        comm_.wait(cs, "gathering the master weights for the checkpoint");
        if (rank == 0)
          for (int r = 0; r < world; r++)
            std::memcpy(snap.master_full.data() + b + static_cast<size_t>(r) * c + o,
                        host + static_cast<size_t>(r) * len, len * sizeof(float));
      }
      lo += c;
    }
    if (rank == 0 && layout_.replicated_begin < total)
      std::copy(snap.master.begin() + static_cast<long>(lo), snap.master.end(),
                snap.master_full.begin() + static_cast<long>(layout_.replicated_begin));
  });
  if (dev) cudaFree(dev);
  if (host) cudaFreeHost(host);
  if (!failure.empty()) throw Error(failure);
  return snap;
}

}  // namespace llmc
