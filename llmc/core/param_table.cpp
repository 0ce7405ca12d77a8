// llmc/core/param_table.cpp: lookups and names of the parameter table (llmc/core/param_table.h).
#include "llmc/core/param_table.h"

#include "llmc/core/common.h"

namespace llmc {

const char* param_role_name(ParamRole role) {
  switch (role) {
    case ParamRole::TokenEmbedding: return "token_embedding";
    case ParamRole::PositionEmbedding: return "position_embedding";
    case ParamRole::NormWeight: return "norm_weight";
    case ParamRole::NormBias: return "norm_bias";
    case ParamRole::LinearWeight: return "linear_weight";
    case ParamRole::LinearBias: return "linear_bias";
    case ParamRole::LmHead: return "lm_head";
  }
  return "unknown";
}

const ParamInfo* ParamTable::find(const std::string& name) const {
  for (const ParamInfo& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamInfo& ParamTable::get(const std::string& name) const {
  const ParamInfo* p = find(name);
  if (!p) throw_error("parameter table: no tensor named '%s' (the table has %zu tensors)", name.c_str(), params.size());
  return *p;
}

}  // namespace llmc
