// llmc/io/optimizer_files.cpp: the optimizer state on disk (llmc/io/optimizer_files.h): parameter files by name,
// per-rank ZeRO-1 shards, and reading any of them back for any set of global pieces.
#include "llmc/io/optimizer_files.h"

#include <algorithm>
#include <cstring>
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

namespace {

// One tensor per ParamTable entry with its shape, cut from the flat buffer `codes` (element i at byte i * code
// bytes of `dtype`).
void write_named_tensors(const std::string& path, const ParamTable& table, const void* codes, const char* dtype,
                         const std::string& content, const StateFormat* state_format) {
  const size_t code_bytes = dtype_size(dtype);
  SafetensorsWriter writer;
  for (const ParamInfo& p : table.params)
    writer.add(p.name, dtype, p.shape, static_cast<const uint8_t*>(codes) + p.offset * code_bytes,
               p.numel * code_bytes);
  writer.set_metadata("format", "llm8");
  writer.set_metadata("content", content);
  if (state_format && *state_format != StateFormat::fp32()) writer.set_metadata(kStateFormatKey, state_format->name);
  writer.write(path);
}

// Reads every tensor of the table by name, which must be of `dtype`, into the flat buffer `codes`.
void read_named_tensors(const SafetensorsReader& reader, const ParamTable& table, const char* dtype, void* codes) {
  const size_t code_bytes = dtype_size(dtype);
  for (const ParamInfo& p : table.params) {
    const TensorEntry& e = reader.entry(p.name);
    if (e.dtype != dtype || e.shape != p.shape)
      throw_error("%s: tensor '%s' is %s with %zu dims; the model needs %s of the shape in its parameter table "
                  "(is this checkpoint from another model config?)",
                  reader.path().c_str(), p.name.c_str(), e.dtype.c_str(), e.shape.size(), dtype);
    reader.read_into(p.name, static_cast<uint8_t*>(codes) + p.offset * code_bytes, p.numel * code_bytes);
  }
}

json parse_metadata_json(const SafetensorsReader& reader, const char* key) {
  auto it = reader.metadata().find(key);
  if (it == reader.metadata().end())
    throw_error("%s: metadata '%s' is missing: not an llm8 optimizer shard", reader.path().c_str(), key);
  return parse_json(it->second, reader.path() + ": metadata '" + key + "'");
}

// The state format of the moments in a file: its "state_format" metadata, fp32 without it.
const StateFormat& file_state_format(const SafetensorsReader& reader) {
  auto it = reader.metadata().find(kStateFormatKey);
  if (it == reader.metadata().end()) return StateFormat::fp32();
  const StateFormat* f = find_state_format(it->second);
  if (!f) {
    std::string valid;
    for (const std::string& name : state_format_names()) valid += (valid.empty() ? "" : ", ") + name;
    throw_error("%s: metadata '%s' = '%s' is not a state format this build reads (%s): was it written by a newer "
                "llm8?", reader.path().c_str(), kStateFormatKey, it->second.c_str(), valid.c_str());
  }
  return *f;
}

// The tensor `name` of a moment must have the dtype of its storage and hold `elements` codes (and a grouped moment's
// "<name>_groups" the F32 metadata of their groups).
void check_moment_tensor(const SafetensorsReader& reader, const std::string& name, const MomentStorage& storage,
                         size_t elements, const StateFormat& format) {
  const TensorEntry& e = reader.entry(name);
  if (e.dtype != storage.safetensors_dtype() || e.nbytes != storage.codes_bytes(elements))
    throw_error("%s: tensor '%s' is %s of %zu bytes; its pieces in state format %s need %s of %zu bytes (corrupt "
                "shard?)", reader.path().c_str(), name.c_str(), e.dtype.c_str(), e.nbytes, format.name,
                storage.safetensors_dtype(), storage.codes_bytes(elements));
  if (!storage.grouped()) return;
  const std::string groups = name + "_groups";
  const TensorEntry& g = reader.entry(groups);
  if (g.dtype != "F32" || g.nbytes != storage.metadata_bytes(elements))
    throw_error("%s: tensor '%s' is %s of %zu bytes; the group metadata of %zu elements in state format %s needs F32 "
                "of %zu bytes (corrupt shard?)", reader.path().c_str(), groups.c_str(), g.dtype.c_str(), g.nbytes,
                elements, format.name, storage.metadata_bytes(elements));
}

// The moments in `to`: decoded to FP32 and encoded again (n elements).
StoredMoments convert_moments(const StoredMoments& from, const StateFormat& to, size_t n) {
  StoredMoments out{to, std::vector<uint8_t>(to.m.bytes(n)), std::vector<uint8_t>(to.v.bytes(n))};
  std::vector<float> values(n);
  decode_moment(from.format.m, from.m.data(), n, values.data());
  encode_moment(to.m, values.data(), n, out.m.data());
  decode_moment(from.format.v, from.v.data(), n, values.data());
  encode_moment(to.v, values.data(), n, out.v.data());
  return out;
}

// The tensor of a grouped moment's codes in optimizer_m/v.safetensors (the whole flat buffer).
constexpr const char* kFlatCodes = "codes";

// The checkpoint tensor names of a grouped moment's metadata: "<codes tensor>_groups".
std::string groups_tensor(const std::string& codes_tensor) { return codes_tensor + "_groups"; }

// A grouped moment must be cut at group boundaries (the last group of the buffer may be partial).
void check_group_cut(const MomentStorage& st, size_t at, const char* what, const std::string& where) {
  if (st.grouped() && at % st.group_size != 0)
    throw_error("%s: %s %zu is not a multiple of the moments' group size %zu (corrupt or foreign checkpoint?)",
                where.c_str(), what, at, st.group_size);
}

// Copies the elements [from, from + count) of the storage block `src` of src_n elements to [to, to + count) of `dst`
// (dst_n elements): codes and, for a grouped moment, the metadata of their groups (from and to on group boundaries).
void copy_moment_elements(const MomentStorage& st, const uint8_t* src, size_t src_n, size_t from, uint8_t* dst,
                          size_t dst_n, size_t to, size_t count) {
  const MomentView a = moment_view(st, const_cast<uint8_t*>(src), src_n, from), b = moment_view(st, dst, dst_n, to);
  std::memcpy(b.codes, a.codes, st.codes_bytes(count));
  if (st.grouped()) std::memcpy(b.groups, a.groups, st.metadata_bytes(count));
}

// The moments of `want` in the format of the files, from optimizer_m/v.safetensors (element-wise formats: one tensor
// per parameter name; grouped formats: the flat codes "codes" and their metadata "codes_groups" of the whole buffer,
// since a group may hold the end of one tensor and the alignment gap after it).
StoredMoments read_named_moments(const std::string& step_dir, const ParamTable& table,
                                 const std::vector<ElementRange>& want, const std::vector<size_t>& dst, size_t n) {
  const SafetensorsReader readers[2] = {SafetensorsReader((fs::path(step_dir) / kMomentFiles[0]).string()),
                                        SafetensorsReader((fs::path(step_dir) / kMomentFiles[1]).string())};
  const StateFormat& format = file_state_format(readers[0]);
  if (file_state_format(readers[1]) != format)
    throw_error("%s holds %s moments but %s holds %s: the checkpoint is inconsistent", readers[0].path().c_str(),
                format.name, readers[1].path().c_str(), file_state_format(readers[1]).name);
  StoredMoments out = StoredMoments::zeros(format, n);
  const MomentStorage* storage[2] = {&format.m, &format.v};
  std::vector<uint8_t>* moment[2] = {&out.m, &out.v};
  const size_t total = table.total_elements;
  for (int k = 0; k < 2; k++) {
    const MomentStorage& st = *storage[k];
    std::vector<uint8_t> full(st.bytes(total), 0);
    if (st.grouped()) {
      check_moment_tensor(readers[k], kFlatCodes, st, total, format);
      const MomentView view = moment_view(st, full.data(), total, 0);
      readers[k].read_into(kFlatCodes, view.codes, st.codes_bytes(total));
      readers[k].read_into(groups_tensor(kFlatCodes), view.groups, st.metadata_bytes(total));
    } else {
      read_named_tensors(readers[k], table, st.safetensors_dtype(), full.data());
    }
    for (size_t i = 0; i < want.size(); i++) {
      check_group_cut(st, want[i].first, "piece start", readers[k].path());
      check_group_cut(st, dst[i], "local offset", readers[k].path());
      copy_moment_elements(st, full.data(), total, want[i].first, moment[k]->data(), n, dst[i],
                           want[i].second - want[i].first);
    }
  }
  return out;
}

// The moments of `want` in the format of the shards, from optimizer_rank*.safetensors, each read only where it
// overlaps `want`.
StoredMoments read_sharded_moments(const std::string& step_dir, const TrainerState& state, const ParamTable& table,
                                   const std::vector<ElementRange>& want, const std::vector<size_t>& dst, size_t n) {
  const std::string fingerprint = param_table_fingerprint(table);
  std::vector<bool> covered(n, false);
  StoredMoments out;
  std::string first_path;
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
    const StateFormat& format = file_state_format(reader);
    if (r == 0) {
      out = StoredMoments::zeros(format, n);
      first_path = path;
    } else if (format != out.format) {
      throw_error("%s holds %s moments but %s holds %s: the checkpoint is inconsistent", path.c_str(), format.name,
                  first_path.c_str(), out.format.name);
    }
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
    check_moment_tensor(reader, "m", format.m, local, format);
    check_moment_tensor(reader, "v", format.v, local, format);
    for (const auto& [g, lo] : file_pieces)
      for (size_t i = 0; i < want.size(); i++) {
        const size_t b = std::max(g.first, want[i].first), e = std::min(g.second, want[i].second);
        if (b >= e) continue;
        const size_t src = lo + (b - g.first), to = dst[i] + (b - want[i].first);
        const std::pair<const char*, const MomentStorage*> moments[2] = {{"m", &format.m}, {"v", &format.v}};
        std::vector<uint8_t>* blocks[2] = {&out.m, &out.v};
        for (int k = 0; k < 2; k++) {
          const auto [name, st] = moments[k];
          check_group_cut(*st, src, "piece offset", path);
          check_group_cut(*st, to, "local offset", path);
          const MomentView view = moment_view(*st, blocks[k]->data(), n, to);
          reader.read_range(name, st->codes_bytes(src), static_cast<uint8_t*>(view.codes), st->codes_bytes(e - b));
          if (st->grouped())
            reader.read_range(groups_tensor(name), st->metadata_bytes(src), reinterpret_cast<uint8_t*>(view.groups),
                              st->metadata_bytes(e - b));
        }
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
  return out;
}

// The state format of a checkpoint's moments, from its first moment file (fp32 when there is none: the readers then
// say what is missing).
const StateFormat& checkpoint_state_format(const std::string& step_dir, bool named) {
  const fs::path first = fs::path(step_dir) / (named ? std::string(kMomentFiles[0]) : optimizer_shard_file(0));
  if (!fs::exists(first)) return StateFormat::fp32();
  return file_state_format(SafetensorsReader(first.string()));
}

}  // namespace

void write_param_tensors(const std::string& path, const ParamTable& table, const float* values,
                         const std::string& content) {
  write_named_tensors(path, table, values, "F32", content, nullptr);
}

void read_param_tensors(const std::string& path, const ParamTable& table, float* values) {
  read_named_tensors(SafetensorsReader(path), table, "F32", values);
}

StoredMoments read_optimizer_moments(const std::string& step_dir, const TrainerState& state, const ParamTable& table,
                                     const std::vector<ElementRange>& want, const StateFormat& format,
                                     std::string* note) {
  size_t n = 0;
  std::vector<size_t> dst(want.size());
  for (size_t i = 0; i < want.size(); i++) {
    if (want[i].first > want[i].second || want[i].second > table.total_elements)
      throw_error("internal error: optimizer range [%zu, %zu) outside the %zu parameters", want[i].first,
                  want[i].second, table.total_elements);
    dst[i] = n;
    n += want[i].second - want[i].first;
  }
  // Full moments by parameter name (one rank, or ZeRO-0), else ZeRO-1 shards.
  const bool named = fs::exists(fs::path(step_dir) / kMomentFiles[0]);
  const auto read = [&](const std::vector<ElementRange>& pieces, const std::vector<size_t>& at, size_t count) {
    return named ? read_named_moments(step_dir, table, pieces, at, count)
                 : read_sharded_moments(step_dir, state, table, pieces, at, count);
  };
  note->clear();
  const StateFormat& saved_format = checkpoint_state_format(step_dir, named);
  const size_t G = saved_format.shard_alignment(), total = table.total_elements;
  bool whole_groups = true;
  for (size_t i = 0; i < want.size(); i++)
    whole_groups = whole_groups && want[i].first % G == 0 && dst[i] % G == 0 &&
                   (want[i].second % G == 0 || want[i].second == total);
  if (!whole_groups) {
    // Pieces that cut the checkpoint's groups (a run of an element-wise format reading grouped moments): each piece's
    // whole groups are read and decoded, and the piece is cut from them.
    std::vector<float> m(n), v(n), piece_values;
    for (size_t i = 0; i < want.size(); i++) {
      const size_t b = want[i].first / G * G, e = std::min(round_up(want[i].second, G), total);
      const StoredMoments piece = read({{b, e}}, {0}, e - b);
      piece_values.resize(e - b);
      decode_moment(piece.format.m, piece.m.data(), e - b, piece_values.data());
      std::copy_n(piece_values.begin() + static_cast<long>(want[i].first - b), want[i].second - want[i].first,
                  m.begin() + static_cast<long>(dst[i]));
      decode_moment(piece.format.v, piece.v.data(), e - b, piece_values.data());
      std::copy_n(piece_values.begin() + static_cast<long>(want[i].first - b), want[i].second - want[i].first,
                  v.begin() + static_cast<long>(dst[i]));
    }
    StoredMoments out{format, std::vector<uint8_t>(format.m.bytes(n)), std::vector<uint8_t>(format.v.bytes(n))};
    encode_moment(format.m, m.data(), n, out.m.data());
    encode_moment(format.v, v.data(), n, out.v.data());
    *note = strformat("optimizer state: checkpoint has %s moments, this run %s: converted", saved_format.name,
                      format.name);
    return out;
  }
  StoredMoments saved = read(want, dst, n);
  if (saved.format == format) return saved;
  *note = strformat("optimizer state: checkpoint has %s moments, this run %s: converted", saved.format.name,
                    format.name);
  return convert_moments(saved, format, n);
}

OptimizerStateFiles read_optimizer_state(const std::string& step_dir, const TrainerState& state,
                                         const ParamTable& table, const std::vector<ElementRange>& owned,
                                         const StateFormat& format) {
  OptimizerStateFiles out;
  out.master_full.assign(table.total_elements, 0.0f);
  read_param_tensors((fs::path(step_dir) / kModelFile).string(), table, out.master_full.data());
  out.moments = read_optimizer_moments(step_dir, state, table, owned, format, &out.note);
  return out;
}

void write_optimizer_snapshot(const OptimizerSnapshot& snap, const std::string& dir) {
  const ParamTable* table = snap.table;
  const int rank = snap.rank;
  const StoredMoments& moments = snap.moments;
  const StateFormat& format = moments.format;
  const auto path = [&](const std::string& name) { return (fs::path(dir) / name).string(); };
  if (rank == 0) write_param_tensors(path(kModelFile), *table, snap.master_full.data(), "fp32 master weights");
  // A grouped moment of n elements: its codes as `name` [n] and its metadata as `name`_groups [groups, scales].
  const auto add_grouped = [](SafetensorsWriter& w, const std::string& name, const MomentStorage& st,
                              const std::vector<uint8_t>& block, size_t n) {
    const MomentView view = moment_view(st, const_cast<uint8_t*>(block.data()), n, 0);
    w.add(name, st.safetensors_dtype(), {static_cast<int64_t>(n)}, view.codes, st.codes_bytes(n));
    w.add(groups_tensor(name), "F32", {static_cast<int64_t>(st.num_groups(n)), st.scales_per_group}, view.groups,
          st.metadata_bytes(n));
  };
  if (snap.kind == "full") {
    if (rank != 0) return;
    const std::vector<uint8_t>* blocks[2] = {&moments.m, &moments.v};
    const MomentStorage* storage[2] = {&format.m, &format.v};
    const char* what[2] = {"adamw first moment, ", "adamw second moment, "};
    for (int k = 0; k < 2; k++) {
      if (!storage[k]->grouped()) {
        write_named_tensors(path(kMomentFiles[k]), *table, blocks[k]->data(), storage[k]->safetensors_dtype(),
                            what[k] + std::string(format.name), &format);
        continue;
      }
      SafetensorsWriter w;
      add_grouped(w, kFlatCodes, *storage[k], *blocks[k], table->total_elements);
      w.set_metadata("format", "llm8");
      w.set_metadata("content", what[k] + std::string(format.name) + " of the whole flat parameter buffer: codes "
                                "and the FP32 metadata of every group of " + std::to_string(storage[k]->group_size));
      w.set_metadata(kStateFormatKey, format.name);
      w.write(path(kMomentFiles[k]));
    }
    return;
  }
  SafetensorsWriter w;
  const std::vector<float>& master = snap.master;
  const int64_t n = static_cast<int64_t>(master.size());
  w.add("master", "F32", {n}, master.data(), master.size() * sizeof(float));
  if (format.m.grouped()) {
    add_grouped(w, "m", format.m, moments.m, master.size());
    add_grouped(w, "v", format.v, moments.v, master.size());
  } else {
    w.add("m", format.m.safetensors_dtype(), {n}, moments.m.data(), moments.m.size());
    w.add("v", format.v.safetensors_dtype(), {n}, moments.v.data(), moments.v.size());
  }
  json pieces = json::array();
  for (const ElementRange& r : snap.owned) pieces.push_back({r.first, r.second});
  w.set_metadata("format", "llm8");
  w.set_metadata("content", "adamw state of one rank (ZeRO-1): fp32 master weights, first and second moment of the "
                            "flat-buffer pieces listed in 'pieces', concatenated in that order");
  if (format != StateFormat::fp32()) w.set_metadata(kStateFormatKey, format.name);
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
  json files = json::array();
  if (snap.kind == "full") {
    files = {kMomentFiles[0], kMomentFiles[1]};
  } else {
    for (int r = 0; r < snap.world_size; r++) files.push_back(optimizer_shard_file(r));
  }
  json d = {{"format", snap.kind},        {"state_format", snap.moments.format.name},
            {"world_size", snap.world_size}, {"zero_stage", snap.zero_stage},
            {"files", files},             {"table_fingerprint", param_table_fingerprint(*snap.table)}};
  if (snap.kind == "sharded") d["layout"] = snap.layout;
  return d;
}

}  // namespace llmc
