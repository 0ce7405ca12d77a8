// llmc/io/optimizer_files.h: the optimizer state in a checkpoint directory.
//   model.safetensors                 every FP32 master weight by parameter name (rank 0; train.init_from and the
//                                     exports read it)
//   optimizer_m / optimizer_v.safetensors   the full AdamW moments by name (one rank, or ZeRO-0)
//   optimizer_rank%05d.safetensors    ZeRO-1: one per rank, its master weights, m and v of the flat-buffer pieces it
//                                     owns, with the pieces, the layout and the parameter-table fingerprint in the
//                                     metadata
// The moments are tensors of their stored dtype (llmc/optim/state_format.h: F32 for fp32, BF16 for bf16, F8_E4M3 for
// fp8 / fp8_expand, whose FP32 group metadata is the tensor "<codes>_groups" [groups, scales per group] next to the
// codes: "m_groups" / "v_groups" in the shards; optimizer_m/v.safetensors of a grouped format hold the whole flat
// buffer as "codes" and "codes_groups", since a group can hold a tensor's end and the gap after it), and every
// file holding moments records their format in the metadata key "state_format", except fp32: its files are exactly
// those of the builds before the key existed, and a file without the key holds fp32 moments.
// Any of them can be read back into any world size and stage (re-sharding by global element offset; the element-wise
// formats can be cut at any element, the grouped ones are copied by whole groups, and pieces that cut a saved group
// are decoded from its whole group), and into any state format (decoded to FP32 and encoded to the run's format once,
// on load, with a note saying so). Codes and metadata are copied exactly, so a run resumes bit for bit.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/param_table.h"
#include "llmc/io/checkpoint.h"
#include "llmc/optim/optimizer_state.h"
#include "llmc/optim/state_format.h"

namespace llmc {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kMomentFiles[2] = {"optimizer_m.safetensors", "optimizer_v.safetensors"};
constexpr const char* kStateFormatKey = "state_format";  // the metadata key of the moments' format
std::string optimizer_shard_file(int rank);  // "optimizer_rank00003.safetensors"

// CRC-32C (hex) of every tensor's name, shape and offset: optimizer shards are only read into the same layout.
std::string param_table_fingerprint(const ParamTable& table);

// values: table.total_elements floats; one F32 tensor per ParamTable entry with its shape.
void write_param_tensors(const std::string& path, const ParamTable& table, const float* values,
                         const std::string& content);
// Reads every tensor of the table by name into values (table.total_elements floats; gaps untouched). llmc::Error
// naming the file and the tensor when one is missing or has another dtype / shape.
void read_param_tensors(const std::string& path, const ParamTable& table, float* values);

// The AdamW moments m and v for the global pieces `want`, concatenated in that order, in `format`, from a checkpoint
// step dir written with any world size, stage and state format: optimizer_m/v.safetensors (by name) or
// optimizer_rank*.safetensors (one per saved rank, each read only where it overlaps `want`). Elements no file covers
// (alignment gaps) are 0. When the checkpoint's format is not `format`, the moments are converted and *note says so
// (else it is cleared). llmc::Error naming the file for a missing shard, a shard of another parameter layout or of
// another state format than the others, tensors of another dtype than their format's, or a gap in the coverage.
StoredMoments read_optimizer_moments(const std::string& step_dir, const TrainerState& state, const ParamTable& table,
                                     const std::vector<ElementRange>& want, const StateFormat& format,
                                     std::string* note);

// What a rank needs to resume its optimizer: every FP32 master weight (model.safetensors) and the moments of `owned`
// in `format` (read_optimizer_moments), for ZeroAdamW::restore; note: the conversion, if any, for the log.
struct OptimizerStateFiles {
  std::vector<float> master_full;
  StoredMoments moments;
  std::string note;
};
OptimizerStateFiles read_optimizer_state(const std::string& step_dir, const TrainerState& state,
                                         const ParamTable& table, const std::vector<ElementRange>& owned,
                                         const StateFormat& format);

// Writes this rank's files of the snapshot into dir (a checkpoint's tmp dir shared by all ranks).
void write_optimizer_snapshot(const OptimizerSnapshot& snap, const std::string& dir);
// For trainer_state.json's "extra": {"optimizer": {"format", "state_format", "world_size", "zero_stage", "files",
// ...}}.
nlohmann::json describe_optimizer_snapshot(const OptimizerSnapshot& snap);

}  // namespace llmc
