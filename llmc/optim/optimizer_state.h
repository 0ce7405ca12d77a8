// llmc/optim/optimizer_state.h: the optimizer state of one rank as a checkpoint sees it, copied to the host: which
// global pieces of the flat parameter buffer this rank holds state for, and their FP32 master weights and AdamW
// moments. Produced by the optimizer (ZeroAdamW::snapshot, a collective), written and read by
// llmc/io/optimizer_files. Host data only.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/param_table.h"

namespace llmc {

using ElementRange = std::pair<size_t, size_t>;  // [first, second) of the flat buffer

struct OptimizerSnapshot {
  const ParamTable* table = nullptr;
  std::string format;            // "full": rank 0 writes optimizer_m/v by name; "sharded": every rank its shard
  int rank = 0, world_size = 1, zero_stage = 0;
  std::vector<ElementRange> owned;  // "sharded": this rank's global pieces, in local order
  nlohmann::json layout;            // "sharded": the shard layout (reduction ranges), recorded for inspection
  std::vector<float> master_full;   // rank 0: every FP32 master weight (model.safetensors)
  std::vector<float> master, m, v;  // "full": the full moments (rank 0); "sharded": this rank's pieces, local order
};

}  // namespace llmc
