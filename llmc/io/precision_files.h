// llmc/io/precision_files.h: the precision state in a checkpoint directory. precision_state.safetensors holds the
// scaling state of the recipe (delayed scaling: "scales" = scale | scale_inv per slot, "amax_history" (slots,
// history_len)); its description (slot names, ring position) goes into trainer_state.json's "extra"."precision", and
// reading checks it against the run (another recipe or model is a clear error).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "llmc/precision/precision_state.h"

namespace llmc {

constexpr const char* kPrecisionFile = "precision_state.safetensors";

void write_precision_state(const std::string& path, const PrecisionState& state);
void read_precision_state(const std::string& path, const nlohmann::json& description, PrecisionState& state);

}  // namespace llmc
