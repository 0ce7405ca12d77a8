// llmc/io/optimizer_files.cpp: the optimizer state on disk (llmc/io/optimizer_files.h): parameter files by name,
// per-rank ZeRO-1 shards, and reading any of them back for any set of global pieces.
#include "llmc/io/optimizer_files.h"

#include <algorithm>
#include <filesystem>

#include "llmc/core/common.h"
#include "llmc/core/input_safety.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace llmc {

std::string param_table_fingerprint(const ParamTable& table) {
  std::string text = strformat("total=%zu\n", table.total_elements);
  for (const ParamInfo& p : table.params) {
    text += p.name + "|" + std::to_string(p.offset) + "|";
    for (int64_t d : p.shape) text += std::to_string(d) + ",";
    text += "\n";
  }
  return crc32c_hex(crc32c(text.data(), text.size()));
}

std::string optimizer_shard_file(int rank) { return strformat("optimizer_rank%05d.safetensors", rank); }

void write_param_tensors(const std::string& path, const ParamTable& table, const float* values,
                         const std::string& content) {
  SafetensorsWriter writer;
  for (const ParamInfo& p : table.params)
    writer.add(p.name, "F32", p.shape, values + p.offset, p.numel * sizeof(float));
  writer.set_metadata("format", "llm8");
  writer.set_metadata("content", content);
  writer.write(path);
}

void read_param_tensors(const std::string& path, const ParamTable& table, float* values) {
  SafetensorsReader reader(path);
  for (const ParamInfo& p : table.params) {
    const TensorEntry& e = reader.entry(p.name);
    if (e.dtype != "F32" || e.shape != p.shape)
      throw_error("%s: tensor '%s' is %s with %zu dims; the model needs F32 of the shape in its parameter table "
                  "(is this checkpoint from another model config?)",
                  path.c_str(), p.name.c_str(), e.dtype.c_str(), e.shape.size());
    reader.read_into(p.name, values + p.offset, p.numel * sizeof(float));
  }
}

namespace {

json parse_metadata_json(const SafetensorsReader& reader, const char* key) {
  auto it = reader.metadata().find(key);
  if (it == reader.metadata().end())
    throw_error("%s: metadata '%s' is missing: not an llm8 optimizer shard", reader.path().c_str(), key);
  return parse_json(it->second, reader.path() + ": metadata '" + key + "'");
}

}  // namespace

void read_optimizer_moments(const std::string& step_dir, const TrainerState& state, const ParamTable& table,
                            const std::vector<ElementRange>& want, std::vector<float>* m, std::vector<float>* v) {
  size_t n = 0;
  std::vector<size_t> dst(want.size());
  for (size_t i = 0; i < want.size(); i++) {
    if (want[i].first > want[i].second || want[i].second > table.total_elements)
      throw_error("internal error: optimizer range [%zu, %zu) outside the %zu parameters", want[i].first,
                  want[i].second, table.total_elements);
    dst[i] = n;
    n += want[i].second - want[i].first;
  }
  m->assign(n, 0.0f);
  v->assign(n, 0.0f);

  // Full moments by parameter name (one rank, or ZeRO-0).
  const std::string full_m = (fs::path(step_dir) / kMomentFiles[0]).string();
  if (fs::exists(full_m)) {
    std::vector<float> fm(table.total_elements, 0.0f), fv(table.total_elements, 0.0f);
    read_param_tensors(full_m, table, fm.data());
    read_param_tensors((fs::path(step_dir) / kMomentFiles[1]).string(), table, fv.data());
    for (size_t i = 0; i < want.size(); i++) {
      std::copy(fm.begin() + want[i].first, fm.begin() + want[i].second, m->begin() + dst[i]);
      std::copy(fv.begin() + want[i].first, fv.begin() + want[i].second, v->begin() + dst[i]);
    }
    return;
  }

  // ZeRO-1 shards: one file per saved rank; read each only where it overlaps what this rank needs.
  const std::string fingerprint = param_table_fingerprint(table);
  std::vector<bool> covered(n, false);
  for (int r = 0; r < state.world_size; r++) {
    const std::string path = (fs::path(step_dir) / optimizer_shard_file(r)).string();
    if (!fs::exists(path))
      throw_error("checkpoint %s has neither %s nor %s (it was written by %d rank(s)): the optimizer state is "
                  "incomplete", step_dir.c_str(), kMomentFiles[0], optimizer_shard_file(r).c_str(), state.world_size);
    SafetensorsReader reader(path);
    const json fp = parse_metadata_json(reader, "table_fingerprint");
    if (fp != fingerprint)
      throw_error("%s was written for another parameter layout (fingerprint %s, this model %s): resume with the same "
                  "model config", path.c_str(), fp.dump().c_str(), fingerprint.c_str());
    const json pieces = parse_metadata_json(reader, "pieces");
    size_t local = 0;
    std::vector<std::pair<ElementRange, size_t>> file_pieces;  // (global piece, local offset)
    for (const json& piece : pieces) {
      if (!piece.is_array() || piece.size() != 2 || !piece[0].is_number_unsigned() || !piece[1].is_number_unsigned())
        throw_error("%s: metadata 'pieces' is malformed", path.c_str());
      const ElementRange g{piece[0].get<size_t>(), piece[1].get<size_t>()};
      if (g.first > g.second || g.second > table.total_elements)
        throw_error("%s: piece [%zu, %zu) is outside the %zu parameters", path.c_str(), g.first, g.second,
                    table.total_elements);
      file_pieces.push_back({g, local});
      local += g.second - g.first;
    }
    for (const char* name : {"m", "v"}) {
      const TensorEntry& e = reader.entry(name);
      if (e.dtype != "F32" || e.nbytes != local * sizeof(float))
        throw_error("%s: tensor '%s' is %s of %zu bytes; its pieces need F32 of %zu bytes (corrupt shard?)",
                    path.c_str(), name, e.dtype.c_str(), e.nbytes, local * sizeof(float));
    }
    for (const auto& [g, lo] : file_pieces)
      for (size_t i = 0; i < want.size(); i++) {
        const size_t b = std::max(g.first, want[i].first), e = std::min(g.second, want[i].second);
        if (b >= e) continue;
        const size_t src = (lo + (b - g.first)) * sizeof(float), to = dst[i] + (b - want[i].first);
        reader.read_range("m", src, m->data() + to, (e - b) * sizeof(float));
        reader.read_range("v", src, v->data() + to, (e - b) * sizeof(float));
        std::fill(covered.begin() + static_cast<long>(to), covered.begin() + static_cast<long>(to + (e - b)), true);
      }
  }
  const auto gap = std::find(covered.begin(), covered.end(), false);
  if (gap != covered.end()) {
    size_t at = static_cast<size_t>(gap - covered.begin()), g = 0;
    for (size_t i = 0; i < want.size(); i++)
      if (at >= dst[i] && at < dst[i] + (want[i].second - want[i].first)) g = want[i].first + (at - dst[i]);
    throw_error("the optimizer shards of %s do not cover parameter element %zu: a shard is missing or was written for "
                "another layout", step_dir.c_str(), g);
  }
}

OptimizerStateFiles read_optimizer_state(const std::string& step_dir, const TrainerState& state,
                                         const ParamTable& table, const std::vector<ElementRange>& owned) {
  OptimizerStateFiles out;
  out.master_full.assign(table.total_elements, 0.0f);
  read_param_tensors((fs::path(step_dir) / kModelFile).string(), table, out.master_full.data());
  read_optimizer_moments(step_dir, state, table, owned, &out.m, &out.v);
  return out;
}

void write_optimizer_snapshot(const OptimizerSnapshot& snap, const std::string& dir) {
  const ParamTable* table = snap.table;
  const int rank = snap.rank;
  const std::string& format = snap.format;
  const std::vector<float>& master_full = snap.master_full;
  const std::vector<float>& master = snap.master;
  const std::vector<float>& m = snap.m;
  const std::vector<float>& v = snap.v;
  const auto path = [&](const std::string& name) { return (fs::path(dir) / name).string(); };
  if (rank == 0) write_param_tensors(path(kModelFile), *table, master_full.data(), "fp32 master weights");
  if (format == "full") {
    if (rank != 0) return;
    write_param_tensors(path(kMomentFiles[0]), *table, m.data(), "adamw first moment, fp32");
    write_param_tensors(path(kMomentFiles[1]), *table, v.data(), "adamw second moment, fp32");
    return;
  }
  SafetensorsWriter w;
  const int64_t n = static_cast<int64_t>(m.size());
  w.add("master", "F32", {n}, master.data(), master.size() * sizeof(float));
  w.add("m", "F32", {n}, m.data(), m.size() * sizeof(float));
  w.add("v", "F32", {n}, v.data(), v.size() * sizeof(float));
  json pieces = json::array();
  for (const ElementRange& r : snap.owned) pieces.push_back({r.first, r.second});
  w.set_metadata("format", "llm8");
  w.set_metadata("content", "adamw state of one rank (ZeRO-1): fp32 master weights, first and second moment of the "
                            "flat-buffer pieces listed in 'pieces', concatenated in that order");
  w.set_metadata("rank", std::to_string(rank));
  w.set_metadata("world_size", std::to_string(snap.world_size));
  w.set_metadata("zero_stage", std::to_string(snap.zero_stage));
  w.set_metadata("total_elements", std::to_string(table->total_elements));
  w.set_metadata("table_fingerprint", json(param_table_fingerprint(*table)).dump());
  w.set_metadata("pieces", pieces.dump());
  w.set_metadata("layout", snap.layout.dump());
  w.write(path(optimizer_shard_file(rank)));
}

json describe_optimizer_snapshot(const OptimizerSnapshot& snap) {
  const std::string& format = snap.format;
  const int world_size = snap.world_size;
  json files = json::array();
  if (format == "full") {
    files = {kMomentFiles[0], kMomentFiles[1]};
  } else {
    for (int r = 0; r < world_size; r++) files.push_back(optimizer_shard_file(r));
  }
  json d = {{"format", format}, {"world_size", world_size}, {"zero_stage", snap.zero_stage}, {"files", files},
            {"table_fingerprint", param_table_fingerprint(*snap.table)}};
  if (format == "sharded") d["layout"] = snap.layout;
  return d;
}

}  // namespace llmc
