// llmc/io/checkpoint.h: run directories, atomic checkpoint writes, checksums, verification, resume, the lineage of a
// run's checkpoints (run id, parent, rollbacks) and retention.
//
// Layout of a run directory (checkpoint.dir):
//   <run>/step_00000300/               one complete checkpoint (8-digit step = optimizer steps completed)
//       model.safetensors              (written by the trainer) FP32 master weights by parameter name
//       optimizer_rank00000.safetensors  (written by the trainer) per-rank optimizer shards, or optimizer.safetensors
//       ...                            any other file the trainer adds (precision state, ...)
//       trainer_state.json             written by commit(), after every other file (format below)
//       DONE                           written last; holds the CRC-32C of trainer_state.json
//   <run>/step_00000400.tmp/           a checkpoint being written (or left by a crash): never read, removed later
//   <run>/step_00000400.old/           a complete checkpoint being replaced by a new one of the same step
//   <run>/abandoned/<UTC time>/        checkpoints a run left behind (a rollback's newer line, or the checkpoints of an
//       set_aside.json                 earlier run under checkpoint.overwrite), moved here whole, never deleted and
//       step_00000500/ ...             never resumed from automatically; set_aside.json says why, when and by which run
//   <run>/metrics.jsonl                (metrics.h) not touched here
//
// trainer_state.json (format_version 1):
//   {"format_version": 1, "step": 300, "world_size": 2,
//    "run_id": "20250611T142233Z-3f9a1c2b", "parent": "runs/x/step_00000200",
//    "rng": <opaque json>, "data": <opaque json, e.g. data positions per rank>, "config": <resolved config>,
//    "extra": <opaque json>, "checksum": "crc32c",
//    "files": [{"name": "model.safetensors", "bytes": 497759232, "crc32c": "1c2f03ab"}, ...]}
// run_id names the run (generated at its first start, kept by every resume); parent is the step dir the checkpoint
// continued from (the run's previous checkpoint, or the one it resumed from), null for the first checkpoint of a
// fresh run. Both are absent in checkpoints written before lineage was recorded; those still load.
//
// Checksums are CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF; the checksum of
// "123456789" is 0xE3069283), computed table-driven (slicing-by-8) or with the SSE4.2 crc32 instruction when the CPU
// has it; both give the same value. Printed as 8 lowercase hex digits.
//
// Starting a run (rank 0, before training): start_run() resolves checkpoint.resume (verified) and then applies the
// lineage rules to the checkpoints already in the run directory (checkpoints_left_behind):
//   - a resume from step S of this run directory with newer complete checkpoints there is a rollback: the newer ones
//     (the abandoned line) are moved into <run>/abandoned/<time>/, so that resume "auto" continues the rollback line;
//   - a fresh start (resume "none", or "auto" with nothing to resume) or a resume from a checkpoint outside the run
//     directory, in a run directory holding complete checkpoints, stops with an error naming checkpoint.dir and
//     checkpoint.overwrite; with checkpoint.overwrite the checkpoints are moved into <run>/abandoned/<time>/.
// It returns the run's lineage (RunLineage), which commit() records in every checkpoint it writes.
//
// Writing (one writer process, rank 0; other ranks may write their files into tmp_dir() on a shared file system
// between the constructor and commit(), e.g. rank 0 constructs → barrier → all ranks write → barrier → rank 0 commits):
//   CheckpointWriter w(run_dir, step);                  // creates <run>/step_N.tmp/ (removing a stale one)
//   SafetensorsWriter model; ...; model.write(w.file_path("model.safetensors"));
//   w.add_json("precision_state.json", j);              // or add_bytes
//   TrainerState st; st.step = step; st.world_size = ...; st.rng = ...; st.data = ...; st.config = ...;
//   std::string dir = w.commit(st, keep, &lineage);     // → "<run>/step_N"
// commit(): checksums every regular file in the tmp dir (all of them are listed), fsyncs each, writes
// trainer_state.json, fsyncs it and the tmp dir, renames step_N.tmp → step_N (an existing step_N is first moved to
// step_N.old and deleted only after the new one is complete; find_latest_checkpoint falls back to a complete .old),
// writes DONE (fsynced), fsyncs the run dir, then applies retention (retention_removals): the checkpoint just written
// counts as kept; then, newest first, complete checkpoints count only once they verify (DONE and every CRC, as
// verify_checkpoint), until `keep` are kept (0 = all). Checkpoints before that point are removed; one that does not
// verify is never counted, so a good older checkpoint is never removed in favour of a corrupt newer one; the
// checkpoint the run resumed from is never removed. Stale *.tmp / *.old dirs and step dirs without DONE are removed.
// If the writer is destroyed without commit() (an exception), its tmp dir is removed.
//
// Reading:
//   resolve_resume(cfg.checkpoint.resume, cfg.checkpoint.dir) → the verified step dir to resume from, or nullopt
//   load_trainer_state(dir) → TrainerState. train_gpt resumes any world size (llmc/distributed/zero re-shards the optimizer
//   state, llmc/io/data continues the data position); check_world_size(state, world_size, dir) is for readers that
//   need the writer's world size.
// Every problem is an llmc::Error naming the file, and, for a corrupt checkpoint, the previous checkpoint that
// verifies (checksums included), if there is one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llmc {

constexpr int kCheckpointFormatVersion = 1;
constexpr const char* kTrainerStateFile = "trainer_state.json";
constexpr const char* kDoneFile = "DONE";

// CRC-32C of a buffer; pass the previous result as `crc` to continue a running checksum (start with 0).
uint32_t crc32c(const void* data, size_t nbytes, uint32_t crc = 0);
// Same, forcing the portable table-driven path (for tests: must equal crc32c()).
uint32_t crc32c_portable(const void* data, size_t nbytes, uint32_t crc = 0);
// CRC-32C of a whole file, streamed in chunks; llmc::Error naming the file if it cannot be read.
uint32_t crc32c_file(const std::string& path);
std::string crc32c_hex(uint32_t crc);  // "e3069283"

struct CheckpointFile {
  std::string name;   // file name inside the step dir
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct TrainerState {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;              // optimizer steps completed; training resumes at this 0-based step
  int world_size = 1;            // ranks that wrote the checkpoint
  std::string run_id;            // the run it belongs to; "" in checkpoints that predate run ids
  std::string parent;            // the step dir it continued from; "" = none (the first checkpoint of a fresh run)
  nlohmann::json rng = nlohmann::json::object();     // opaque RNG state, given by the caller
  nlohmann::json data = nlohmann::json::object();    // opaque data-loader positions (e.g. per rank)
  nlohmann::json config = nlohmann::json::object();  // resolved config snapshot (config_to_json)
  nlohmann::json extra = nlohmann::json::object();   // anything else the trainer wants to keep
  std::vector<CheckpointFile> files;                 // filled by commit() / read by load_trainer_state()
  nlohmann::json raw;                                // the whole trainer_state.json as read (empty when writing)
};

// "step_00000300" and "<run_dir>/step_00000300".
std::string step_dir_name(int64_t step);
std::string step_dir_path(const std::string& run_dir, int64_t step);
// The directory other ranks write into while step `step` is being written: "<run_dir>/step_00000300.tmp".
std::string checkpoint_tmp_path(const std::string& run_dir, int64_t step);
// Parses "step_00000300" (8 or more digits, nothing after) → 300; nullopt for any other name.
std::optional<int64_t> parse_step_dir_name(const std::string& name);
// Whether path is a checkpoint step directory: a directory holding trainer_state.json or DONE (complete or not).
bool is_checkpoint_step_dir(const std::string& path);

// "20250611T142233Z-3f9a1c2b": the UTC time of the call and 32 random bits.
std::string new_run_id();

// The lineage of the checkpoints one process writes (rank 0 keeps it; start_run fills it, commit updates it).
struct RunLineage {
  std::string run_id;        // recorded in every checkpoint
  std::string resumed_from;  // the step dir the run resumed from ("" = fresh start): retention never removes it
  std::string parent;        // the parent of the next checkpoint: the last one written, else resumed_from
  std::map<std::string, bool> verified;  // step dir (weakly canonical path) → whether it verified, checked once
};

class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& run_dir, int64_t step);  // creates run_dir if needed and a fresh tmp dir
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  const std::string& tmp_dir() const;
  // Path of a file to write into the checkpoint; `name` is a plain file name (no '/'), not trainer_state.json or DONE.
  std::string file_path(const std::string& name) const;
  void add_bytes(const std::string& name, const void* data, size_t nbytes);  // writes and fsyncs the file
  void add_json(const std::string& name, const nlohmann::json& j);           // pretty-printed JSON file
  // Writes trainer_state.json (state.step must equal the writer's step; state.files is replaced), publishes the
  // checkpoint, applies retention; returns the final step dir. Call once. With a lineage, state.run_id and
  // state.parent are taken from it, retention protects lineage->resumed_from and reuses (and records) what this
  // process already verified, and the lineage moves on (parent = this checkpoint). Notes (a checkpoint that does not
  // verify and is therefore not counted) are appended to `notes` when given.
  std::string commit(TrainerState state, int keep, RunLineage* lineage = nullptr,
                     std::vector<std::string>* notes = nullptr);

 private:
  std::string run_dir_, tmp_dir_, final_dir_;
  int64_t step_;
  bool committed_ = false;
};

struct CheckpointInfo {
  int64_t step = 0;
  std::string path;   // the step dir
  bool complete = false;  // has DONE
};

// Every step_NNNNNNNN dir of the run (not *.tmp / *.old), ascending by step. Missing run dir → empty.
std::vector<CheckpointInfo> list_checkpoints(const std::string& run_dir);
// Every complete checkpoint of the run (step dirs with DONE, and complete step_N.old fallbacks), ascending by step.
std::vector<CheckpointInfo> list_complete_checkpoints(const std::string& run_dir);

// Retention after the checkpoint of `current_step` was written, decided from the run dir's step dirs (`listing`, as
// list_checkpoints) without touching the file system: the current checkpoint counts as kept; then, newest first,
// each complete checkpoint is asked verifies(path) and counts when it does, until `keep` are kept (keep 0 = keep
// all). Returns the paths to remove: every complete checkpoint past that point (not asked), and every step dir
// without DONE. Never `protected_dir` (the checkpoint the run resumed from; "" = none), never one that did not verify
// while fewer than `keep` were counted, never the current one.
std::vector<std::string> retention_removals(const std::vector<CheckpointInfo>& listing, int64_t current_step, int keep,
                                            const std::string& protected_dir,
                                            const std::function<bool(const std::string&)>& verifies);

// The complete checkpoints that a run starting in run_dir leaves behind, decided from `complete` (the run dir's
// complete checkpoints: step dirs and complete step_N.old fallbacks) without touching the file system:
//   resumed from step S of run_dir (resume_step = S, resume_in_run_dir): every one newer than S (a rollback);
//   a fresh start (resume_step = nullopt) or a resume from a checkpoint outside run_dir: all of them, and only with
//   `overwrite`: otherwise an llmc::Error naming checkpoint.dir, checkpoint.resume (`resume_mode`) and
//   checkpoint.overwrite.
std::vector<CheckpointInfo> checkpoints_left_behind(const std::vector<CheckpointInfo>& complete,
                                                    std::optional<int64_t> resume_step, bool resume_in_run_dir,
                                                    bool overwrite, const std::string& run_dir,
                                                    const std::string& resume_mode);

// Moves `dirs` (step dirs of run_dir) into a new <run_dir>/abandoned/<UTC time>/ (renames: nothing is copied or
// deleted) with a set_aside.json holding `why` and the moved names; returns that directory.
std::string set_aside_checkpoints(const std::string& run_dir, const std::vector<CheckpointInfo>& dirs,
                                  const nlohmann::json& why);

// The start of a run (rank 0, before training), as described at the top: the verified checkpoint to resume from
// (nullopt = fresh start), the run's lineage, and notes (skipped dirs, checkpoints moved aside), one sentence each.
struct RunStart {
  std::optional<std::string> resume_dir;
  RunLineage lineage;
  std::vector<std::string> notes;
};
RunStart start_run(const std::string& resume_mode, const std::string& run_dir, bool overwrite);

// The newest step dir with a DONE marker (not verified), or nullopt. Skipped incomplete dirs, ignored *.tmp dirs and
// a fallback to a complete step_N.old are described in `notes` (one sentence each) when it is given.
std::optional<std::string> find_latest_checkpoint(const std::string& run_dir, std::vector<std::string>* notes = nullptr);

// Parses <step_dir>/trainer_state.json: known format version, step, world size, file list. llmc::Error naming the file.
TrainerState load_trainer_state(const std::string& step_dir);

// Full check: DONE present and matching trainer_state.json's CRC, trainer_state.json valid, its step matching the dir
// name, every listed file present with the right size and CRC-32C. Returns the state. On failure an llmc::Error such
// as "checkpoint file runs/x/step_00000300/model.safetensors is corrupt (checksum mismatch): the previous checkpoint
// runs/x/step_00000200 is still usable, remove the corrupt directory or set checkpoint.resume to it" (said only after
// that checkpoint verified in full; otherwise the next older one is tried, and with none the message says so).
TrainerState verify_checkpoint(const std::string& step_dir);

// mode "none" → nullopt; "auto" → the newest complete checkpoint of run_dir, verified (nullopt when run_dir is empty,
// missing, or holds none; an error when the newest complete one is corrupt); anything else is a step dir path that
// must exist, be complete and verify. Notes (skipped dirs) are appended to `notes` when given. The returned dir has
// been verified, checksums included: no need to call verify_checkpoint again.
std::optional<std::string> resolve_resume(const std::string& mode /*auto|none|path*/, const std::string& run_dir,
                                          std::vector<std::string>* notes = nullptr);

// The message for a world-size mismatch, and the check that throws it (llmc::Error) when saved != current.
std::string world_size_mismatch_message(const std::string& step_dir, int saved_world_size, int current_world_size);
void check_world_size(const TrainerState& state, int current_world_size, const std::string& step_dir);

}  // namespace llmc
