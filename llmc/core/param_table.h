// llmc/core/param_table.h: the parameter table, the one description of a model's named tensors in its flat buffers
// (bf16 weights, FP32 gradients, master weights, optimizer moments): name, shape, offset, role, block, weight decay,
// initialisation. Model families build it (llmc/model/model); initialisation, the optimizer, ZeRO sharding, checkpoints and
// export all read it, so it sits in core where every layer can. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace llmc {

// What a tensor is. Rows past the real vocabulary of TokenEmbedding and LmHead tensors are padding: initialised to 0
// and kept at 0 by training (their logits are never part of the loss), dropped by export.
enum class ParamRole { TokenEmbedding, PositionEmbedding, NormWeight, NormBias, LinearWeight, LinearBias, LmHead };
const char* param_role_name(ParamRole role);

struct ParamInfo {
  std::string name;            // Hugging Face name, e.g. "transformer.h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // e.g. {2304, 768}: nn.Linear (out, in) layout, also for GPT-2's Conv1D tensors
  size_t offset = 0;           // element offset in the flat parameter / gradient buffers (aligned, see below)
  size_t numel = 0;
  int layer = -1;              // transformer block index, -1 for embeddings and the final norm
  ParamRole role = ParamRole::LinearWeight;
  bool weight_decay = false;   // AdamW decays 2-D tensors only (matrices and embeddings)
  float init_std = 0.0f;       // normal(0, init_std) at initialisation; 0 means constant init_value
  float init_value = 0.0f;     // for norms (1) and biases (0)
};

struct ParamTable {
  static constexpr size_t kAlign = 128;  // every tensor starts at a multiple of 128 elements (256 B in bf16)
  std::vector<ParamInfo> params;         // in storage order
  size_t total_elements = 0;             // size of the flat buffers including alignment gaps
  size_t num_parameters = 0;             // sum of numel (padded vocabulary rows included)
  int vocab_size = 0;                    // real vocabulary: rows of transformer.wte.weight past it are padding
  const ParamInfo& get(const std::string& name) const;  // throws llmc::Error naming the tensor if absent
  const ParamInfo* find(const std::string& name) const;  // nullptr if absent
};

// The first NaN or Inf of the table's tensors in `values` (a flat buffer laid out by the table: weights, gradients),
// in storage order or, with output_side_first, from the last tensor backwards (the order backward finishes
// gradients), as "name[i, j] = nan" (the element's index in the tensor's shape); "" when every element is finite.
// The alignment gaps between tensors are not looked at.
std::string first_nonfinite_element(const ParamTable& table, const float* values, bool output_side_first = false);

}  // namespace llmc
