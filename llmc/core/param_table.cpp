// llmc/core/param_table.cpp: lookups and names of the parameter table (llmc/core/param_table.h).
#include "llmc/core/param_table.h"

#include <cmath>

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

std::string first_nonfinite_element(const ParamTable& table, const float* values, bool output_side_first) {
  const size_t n = table.params.size();
  for (size_t k = 0; k < n; k++) {
    const ParamInfo& p = table.params[output_side_first ? n - 1 - k : k];
    const float* v = values + p.offset;
    for (size_t i = 0; i < p.numel; i++) {
      if (std::isfinite(v[i])) continue;
      std::vector<int64_t> index(p.shape.size());  // row-major: the last dimension varies fastest
      size_t rest = i;
      for (size_t d = p.shape.size(); d-- > 0;) {
        index[d] = static_cast<int64_t>(rest % static_cast<size_t>(p.shape[d]));
        rest /= static_cast<size_t>(p.shape[d]);
      }
      std::string where;
      for (int64_t x : index) where += (where.empty() ? "" : ", ") + std::to_string(x);
      return strformat("%s[%s] = %s", p.name.c_str(), where.c_str(),
                       std::isnan(v[i]) ? "nan" : (v[i] > 0 ? "inf" : "-inf"));
    }
  }
  return "";
}

}  // namespace llmc
