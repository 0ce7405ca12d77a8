// llmc/optim/optimizer_state.h: the optimizer state as it leaves and enters the GPU, on the host: the AdamW moments of
// a list of global element ranges in their stored format (raw codes + the format that describes them), and the
// snapshot of one rank's state that a checkpoint writes (which global pieces of the flat parameter buffer this rank
// holds state for, their FP32 master weights and moments). Produced by the optimizer (ZeroAdamW::snapshot, a
// collective), written and read by llmc/io/optimizer_files. Host data only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/param_table.h"
#include "llmc/optim/state_format.h"

namespace llmc {

using ElementRange = std::pair<size_t, size_t>;  // [first, second) of the flat buffer

// m and v of some element ranges, concatenated in the ranges' order, as `format` stores them.
struct StoredMoments {
  StateFormat format;
  std::vector<uint8_t> m, v;  // format.m.bytes(n), format.v.bytes(n)

  // n elements of zeros (the state of a fresh optimizer in every element-wise format).
  static StoredMoments zeros(const StateFormat& format, size_t n) {
    return {format, std::vector<uint8_t>(format.m.bytes(n), 0), std::vector<uint8_t>(format.v.bytes(n), 0)};
  }
};

struct OptimizerSnapshot {
  const ParamTable* table = nullptr;
  std::string kind;              // "full": rank 0 writes optimizer_m/v by name; "sharded": every rank its shard
  int rank = 0, world_size = 1, zero_stage = 0;
  std::vector<ElementRange> owned;  // "sharded": this rank's global pieces, in local order
  nlohmann::json layout;            // "sharded": the shard layout (reduction ranges), recorded for inspection
  std::vector<float> master_full;   // rank 0: every FP32 master weight (model.safetensors)
  std::vector<float> master;        // "sharded": this rank's pieces, local order
  StoredMoments moments;            // "full": of the whole buffer (rank 0); "sharded": of this rank's pieces
};

}  // namespace llmc
