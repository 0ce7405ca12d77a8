// llmc/run/memory_plan.h: the device memory of a run on one GPU (one rank under ZeRO-1), by what it holds, taken from
// the code that allocates it rather than from a formula of its own:
//   - the model: its own constructors run with DeviceMemory::Count (llmc/model/model.h plan_model_memory): the bf16
//     weights and FP32 gradients of the parameter table, the family's activation plan by ActivationUse, and the
//     precision state of the recipe (the linears' quantised weight caches and saved inputs, the shared quantised
//     scratch, the scaling slots and amax histories);
//   - the optimizer: FP32 master weights and optimizer.state_format's m.bytes(n) + v.bytes(n) (llmc/optim/
//     state_format.h, what AdamW allocates) over the n elements this rank owns (llmc/distributed/zero.h
//     make_shard_layout under ZeRO-1, the whole table otherwise);
//   - the cuBLASLt workspace (llmc/precision/gemm.h).
// Not counted: the CUDA context and NCCL's buffers (not ours; training measures them as the memory in use before the
// run allocates), and buffers under 1 MiB (norm partials, the embedding's backward plan, loss accumulators,
// telemetry). Host only: --dry-run prints it, and training logs it beside the measured peak.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "llmc/run/config.h"

namespace llmc {

struct MemoryPlan {
  // The rows --dry-run prints, in order; their bytes sum to total().
  struct Row {
    const char* name;     // "weights"
    std::string detail;   // "bf16, the whole parameter table"
    size_t bytes;
  };
  std::vector<Row> rows;
  int world_size = 1;
  bool sharded = false;          // ZeRO-1 over several ranks: master weights and optimizer states are this rank's
  size_t optimizer_elements = 0;  // parameters whose master weight and moments this rank keeps
  size_t total() const;
  size_t bytes(const std::string& row_name) const;  // the row named so (llmc::Error if none)
};

// The plan of cfg on one rank of world_size (no GPU needed); throws what building the model would throw.
MemoryPlan plan_memory(const RunConfig& cfg, int world_size);

// The --dry-run table: one line per row and the total, in GiB with the byte counts, each line starting with indent.
std::string format_memory_plan(const MemoryPlan& plan, const std::string& indent);

// "24.53 GiB"
std::string format_gib(size_t bytes);

}  // namespace llmc
