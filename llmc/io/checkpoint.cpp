// llmc/io/checkpoint.cpp: implementation of CRC-32C, the atomic checkpoint writer, verification, resume, the lineage
// of a run's checkpoints (run start, rollbacks, checkpoints set aside) and retention (layout and protocol documented
// in checkpoint.h).
#include "llmc/io/checkpoint.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "llmc/core/common.h"
#include "llmc/core/file_io.h"
#include "llmc/core/input_safety.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace llmc {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the slicing-by-8 CRC assumes a little-endian host");

// ----------------------------------------------------------------------------------------------------------------
// CRC-32C

namespace {

constexpr uint32_t kCrc32cPolyReflected = 0x82F63B78u;
constexpr size_t kFileChunkBytes = size_t(8) << 20;  // streamed checksum reads 8 MiB at a time
constexpr int kStepDigits = 8;
constexpr uint64_t kMaxTextFileBytes = 64u << 20;  // trainer_state.json holds the config and the data positions
constexpr int64_t kMaxWorldSize = 1 << 20;          // ranks a trainer_state.json may name
static_assert(size_limits::kSteps == 1000000000 && kMaxWorldSize == 1048576, "quoted in load_trainer_state's errors");
constexpr const char* kAbandonedDir = "abandoned";       // <run>/abandoned/<UTC time>/: checkpoints set aside
constexpr const char* kSetAsideFile = "set_aside.json";  // in each of them: why, when, by which run

// tables[k][b]: CRC contribution of byte b followed by k zero bytes (slicing-by-8).
struct Crc32cTables {
  uint32_t t[8][256];
  Crc32cTables() {
    for (uint32_t b = 0; b < 256; b++) {
      uint32_t c = b;
      for (int bit = 0; bit < 8; bit++) c = (c & 1) ? (c >> 1) ^ kCrc32cPolyReflected : c >> 1;
      t[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
      for (uint32_t b = 0; b < 256; b++) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
};

const Crc32cTables& crc_tables() {
  static const Crc32cTables tables;
  return tables;
}

// Raw update of a CRC register (no pre/post inversion).
uint32_t crc32c_update_portable(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& t = crc_tables().t;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = t[7][word & 0xff] ^ t[6][(word >> 8) & 0xff] ^ t[5][(word >> 16) & 0xff] ^ t[4][(word >> 24) & 0xff] ^
          t[3][(word >> 32) & 0xff] ^ t[2][(word >> 40) & 0xff] ^ t[1][(word >> 48) & 0xff] ^ t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_update_sse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = uint32_t(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, size_t nbytes, uint32_t crc) {
  return ~crc32c_update_portable(~crc, static_cast<const uint8_t*>(data), nbytes);
}

uint32_t crc32c(const void* data, size_t nbytes, uint32_t crc) {
#if defined(__x86_64__)
  if (cpu_has_sse42()) return ~crc32c_update_sse42(~crc, static_cast<const uint8_t*>(data), nbytes);
#endif
  return crc32c_portable(data, nbytes, crc);
}

std::string crc32c_hex(uint32_t crc) { return strformat("%08x", crc); }

// ----------------------------------------------------------------------------------------------------------------
// File-system helpers

namespace {

// Reads a whole file through the checksum, optionally fsyncing it (commit) in the same open; returns the CRC.
uint32_t checksum_file(const std::string& path, uint64_t* bytes_out, bool fsync_it) {
  const int fd = open_regular_file(path, "checkpoint file");
  std::vector<uint8_t> buf(kFileChunkBytes);
  uint32_t crc = 0;
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw_error("checkpoint: read error in %s: %s", path.c_str(), std::strerror(err));
    }
    if (n == 0) break;
    crc = crc32c(buf.data(), size_t(n), crc);
    total += uint64_t(n);
  }
  if (fsync_it && ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    throw_error("checkpoint: fsync of %s failed: %s", path.c_str(), std::strerror(err));
  }
  ::close(fd);
  if (bytes_out) *bytes_out = total;
  return crc;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems do not allow opening directories
  ::fsync(fd);
  ::close(fd);
}

// Writes (truncating) and fsyncs a file.
void write_file_synced(const std::string& path, const void* data, size_t nbytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_error("checkpoint: cannot create %s: %s", path.c_str(), std::strerror(errno));
  const IoResult written = write_fully(fd, data, nbytes);
  if (!written.ok()) {
    ::close(fd);
    throw_error("checkpoint: cannot write %s: %s (hint: is the disk full?)", path.c_str(), written.what());
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    throw_error("checkpoint: fsync of %s failed: %s", path.c_str(), std::strerror(err));
  }
  if (::close(fd) != 0) throw_error("checkpoint: closing %s failed: %s", path.c_str(), std::strerror(errno));
}

// A small text file of a checkpoint (DONE, trainer_state.json): false when it does not exist; an llmc::Error naming
// it when it is not a regular file (a FIFO is never opened for reading) or larger than kMaxTextFileBytes.
bool read_text_file(const std::string& path, std::string* out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *out = read_regular_file(path, "checkpoint file", kMaxTextFileBytes);
  return true;
}

bool is_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) throw_error("checkpoint: cannot remove %s: %s", path.c_str(), ec.message().c_str());
}

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string done_contents(uint32_t state_crc) {
  return std::string(kTrainerStateFile) + " crc32c " + crc32c_hex(state_crc) + "\n";
}

// A step dir name with an optional suffix (".tmp", ".old") → step; nullopt for other names.
std::optional<int64_t> parse_step_name_with_suffix(const std::string& name, const std::string& suffix) {
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  return parse_step_dir_name(name.substr(0, name.size() - suffix.size()));
}

bool has_done(const std::string& step_dir) { return is_file(join(step_dir, kDoneFile)); }

// The step of a step dir path (its last component, with an optional .old suffix), if it is named like one.
std::optional<int64_t> step_of_dir(const std::string& step_dir) {
  std::string name = fs::path(step_dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(step_dir).lexically_normal().parent_path().filename().string();
  if (auto s = parse_step_dir_name(name)) return s;
  return parse_step_name_with_suffix(name, ".old");
}

// The run directory a step dir lies in ("." for a bare name).
std::string run_dir_of(const std::string& step_dir) {
  fs::path normal = fs::path(step_dir).lexically_normal();
  if (normal.filename().empty()) normal = normal.parent_path();
  return normal.parent_path().empty() ? "." : normal.parent_path().string();
}

// The key a path has in RunLineage::verified: the same directory named two ways gets one key.
std::string canonical_key(const std::string& path) {
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(path, ec);
  return ec ? fs::path(path).lexically_normal().string() : canonical.string();
}

bool same_dir(const std::string& a, const std::string& b) {
  std::error_code ec;
  return !a.empty() && !b.empty() && fs::equivalent(a, b, ec) && !ec;
}

// "20250611T142233Z"
std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string names_of(const std::vector<CheckpointInfo>& dirs) {
  std::string out;
  for (const CheckpointInfo& c : dirs) out += (out.empty() ? "" : ", ") + fs::path(c.path).filename().string();
  return out;
}

// verify_checkpoint without the hint about an older usable checkpoint (defined with the readers below).
TrainerState verify_contents(const std::string& step_dir);

bool checkpoint_verifies(const std::string& step_dir) {
  try {
    verify_contents(step_dir);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The end of a "checkpoint X is corrupt" message: the newest older checkpoint that verifies in full, or that none does.
std::string previous_checkpoint_hint(const std::string& step_dir) {
  const std::string run_dir = run_dir_of(step_dir);
  const std::optional<int64_t> step = step_of_dir(step_dir);
  std::vector<CheckpointInfo> all = list_checkpoints(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (step && it->step >= *step) continue;
    if (it->complete && checkpoint_verifies(it->path))
      return strformat(": the previous checkpoint %s is still usable (its checksums verify), remove the corrupt "
                       "directory %s or set checkpoint.resume to it",
                       it->path.c_str(), step_dir.c_str());
  }
  return strformat(": no earlier checkpoint in %s verifies; remove the corrupt directory %s and start over "
                   "(checkpoint.resume=none)",
                   run_dir.c_str(), step_dir.c_str());
}

// Retention after a successful commit (see checkpoint.h): stale *.tmp / *.old dirs, then retention_removals.
void apply_retention(const std::string& run_dir, int64_t current_step, int keep, RunLineage* lineage,
                     std::vector<std::string>* notes) {
  const std::string resumed_from = lineage ? lineage->resumed_from : "";
  std::error_code ec;
  std::vector<std::string> to_remove;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool stale = parse_step_name_with_suffix(name, ".tmp") || parse_step_name_with_suffix(name, ".old");
    if (entry.is_directory() && stale && !same_dir(entry.path().string(), resumed_from))
      to_remove.push_back(entry.path().string());
  }
  const std::vector<CheckpointInfo> listing = list_checkpoints(run_dir);
  std::string protected_dir;
  for (const CheckpointInfo& c : listing)
    if (same_dir(c.path, resumed_from)) protected_dir = c.path;
  auto verifies = [&](const std::string& path) {
    const std::string key = canonical_key(path);
    if (lineage)
      if (auto it = lineage->verified.find(key); it != lineage->verified.end()) return it->second;
    std::string problem;
    try {
      verify_contents(path);
    } catch (const Error& e) {
      problem = e.what();
    }
    if (!problem.empty() && notes)
      notes->push_back(strformat("%s does not verify (%s): it is not counted for checkpoint.keep, and stays until %d "
                                 "newer checkpoints verify", path.c_str(), problem.c_str(), keep));
    if (lineage) lineage->verified[key] = problem.empty();
    return problem.empty();
  };
  for (const std::string& path : retention_removals(listing, current_step, keep, protected_dir, verifies))
    to_remove.push_back(path);
  for (const std::string& path : to_remove) remove_tree(path);
  if (!to_remove.empty()) fsync_dir(run_dir);
}

}  // namespace

uint32_t crc32c_file(const std::string& path) { return checksum_file(path, nullptr, /*fsync_it=*/false); }

// ----------------------------------------------------------------------------------------------------------------
// Names

std::string step_dir_name(int64_t step) {
  if (step < 0) throw_error("checkpoint: negative step %lld", (long long)step);
  return strformat("step_%0*lld", kStepDigits, (long long)step);
}

std::string step_dir_path(const std::string& run_dir, int64_t step) { return join(run_dir, step_dir_name(step)); }

std::string checkpoint_tmp_path(const std::string& run_dir, int64_t step) { return step_dir_path(run_dir, step) + ".tmp"; }

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  const std::string prefix = "step_";
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() < size_t(kStepDigits) || digits.size() > 18) return std::nullopt;
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  return std::stoll(digits);
}

bool is_checkpoint_step_dir(const std::string& path) {
  return is_dir(path) && (is_file(join(path, kTrainerStateFile)) || is_file(join(path, kDoneFile)));
}

std::string new_run_id() {
  std::random_device entropy;
  return utc_stamp() + "-" + strformat("%08x", static_cast<unsigned>(entropy()));
}

// ----------------------------------------------------------------------------------------------------------------
// Writer

CheckpointWriter::CheckpointWriter(const std::string& run_dir, int64_t step)
    : run_dir_(run_dir), tmp_dir_(checkpoint_tmp_path(run_dir, step)), final_dir_(step_dir_path(run_dir, step)),
      step_(step) {
  if (run_dir.empty()) throw_error("checkpoint: checkpoint.dir is empty: set it to a run directory");
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec || !is_dir(run_dir))
    throw_error("checkpoint: cannot create the run directory %s (checkpoint.dir): %s", run_dir.c_str(),
                ec ? ec.message().c_str() : "exists and is not a directory");
  if (fs::exists(tmp_dir_, ec)) remove_tree(tmp_dir_);  // stale, from an interrupted write
  if (!fs::create_directory(tmp_dir_, ec) || ec)
    throw_error("checkpoint: cannot create %s: %s", tmp_dir_.c_str(), ec.message().c_str());
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);  // best effort; a leftover is removed by the next writer
}

const std::string& CheckpointWriter::tmp_dir() const { return tmp_dir_; }

std::string CheckpointWriter::file_path(const std::string& name) const {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw_error("checkpoint: '%s' is not a plain file name for a checkpoint file", name.c_str());
  if (name == kTrainerStateFile || name == kDoneFile)
    throw_error("checkpoint: '%s' is written by CheckpointWriter::commit itself; choose another file name", name.c_str());
  if (committed_) throw_error("checkpoint: %s is already committed; cannot add '%s'", final_dir_.c_str(), name.c_str());
  return join(tmp_dir_, name);
}

void CheckpointWriter::add_bytes(const std::string& name, const void* data, size_t nbytes) {
  write_file_synced(file_path(name), data, nbytes);
}

void CheckpointWriter::add_json(const std::string& name, const nlohmann::json& j) {
  const std::string text = j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  add_bytes(name, text.data(), text.size());
}

std::string CheckpointWriter::commit(TrainerState state, int keep, RunLineage* lineage,
                                    std::vector<std::string>* notes) {
  if (committed_) throw_error("checkpoint: %s is already committed", final_dir_.c_str());
  if (state.step != step_)
    throw_error("checkpoint: trainer state step %lld differs from the writer's step %lld", (long long)state.step,
                (long long)step_);
  if (state.world_size < 1) throw_error("checkpoint: world_size must be >= 1 (got %d)", state.world_size);
  if (keep < 0) throw_error("checkpoint: checkpoint.keep must be >= 0 (got %d)", keep);
  if (lineage) {
    state.run_id = lineage->run_id;
    state.parent = lineage->parent;
  }

  // 1. Checksum and fsync every file the caller (and other ranks) wrote.
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(tmp_dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kTrainerStateFile || name == kDoneFile) continue;
    if (!entry.is_regular_file())
      throw_error("checkpoint: %s is not a plain file; checkpoint files must be plain files in %s",
                  entry.path().c_str(), tmp_dir_.c_str());
    names.push_back(name);
  }
  if (ec) throw_error("checkpoint: cannot list %s: %s", tmp_dir_.c_str(), ec.message().c_str());
  std::sort(names.begin(), names.end());
  state.files.clear();
  for (const std::string& name : names) {
    CheckpointFile f;
    f.name = name;
    f.crc32c = checksum_file(join(tmp_dir_, name), &f.bytes, /*fsync_it=*/true);
    state.files.push_back(f);
  }

  // 2. trainer_state.json, then the directory entry.
  json j;
  j["format_version"] = kCheckpointFormatVersion;
  j["step"] = state.step;
  j["world_size"] = state.world_size;
  j["run_id"] = state.run_id;
  j["parent"] = state.parent.empty() ? json(nullptr) : json(state.parent);
  j["rng"] = state.rng;
  j["data"] = state.data;
  j["config"] = state.config;
  j["extra"] = state.extra;
  j["checksum"] = "crc32c";
  j["files"] = json::array();
  for (const CheckpointFile& f : state.files)
    j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", crc32c_hex(f.crc32c)}});
  const std::string state_text = j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  write_file_synced(join(tmp_dir_, kTrainerStateFile), state_text.data(), state_text.size());
  fsync_dir(tmp_dir_);

  // 3. Publish: move an existing checkpoint of this step aside, rename tmp → final, then DONE.
  const std::string old_dir = final_dir_ + ".old";
  if (fs::exists(final_dir_, ec)) {
    if (fs::exists(old_dir, ec)) remove_tree(old_dir);
    if (::rename(final_dir_.c_str(), old_dir.c_str()) != 0)
      throw_error("checkpoint: cannot move %s aside to %s: %s", final_dir_.c_str(), old_dir.c_str(), std::strerror(errno));
  }
  if (::rename(tmp_dir_.c_str(), final_dir_.c_str()) != 0)
    throw_error("checkpoint: cannot rename %s to %s: %s", tmp_dir_.c_str(), final_dir_.c_str(), std::strerror(errno));
  committed_ = true;
  fsync_dir(run_dir_);
  const std::string done = done_contents(crc32c(state_text.data(), state_text.size()));
  write_file_synced(join(final_dir_, kDoneFile), done.data(), done.size());
  fsync_dir(final_dir_);
  fsync_dir(run_dir_);

  // 4. The lineage moves on; retention (also removes the replaced .old and stale *.tmp dirs).
  if (lineage) {
    lineage->parent = final_dir_;
    lineage->verified[canonical_key(final_dir_)] = true;  // its checksums were computed from the files just now
  }
  apply_retention(run_dir_, step_, keep, lineage, notes);
  return final_dir_;
}

// ----------------------------------------------------------------------------------------------------------------
// Reading

std::vector<CheckpointInfo> list_checkpoints(const std::string& run_dir) {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (run_dir.empty() || !is_dir(run_dir)) return out;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    if (!entry.is_directory()) continue;
    const std::string path = entry.path().string();
    if (auto step = parse_step_dir_name(entry.path().filename().string())) out.push_back({*step, path, has_done(path)});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return out;
}

std::vector<CheckpointInfo> list_complete_checkpoints(const std::string& run_dir) {
  std::vector<CheckpointInfo> out;
  for (const CheckpointInfo& c : list_checkpoints(run_dir))
    if (c.complete) out.push_back(c);
  std::error_code ec;
  if (!run_dir.empty() && is_dir(run_dir))
    for (const auto& entry : fs::directory_iterator(run_dir, ec))
      if (auto step = parse_step_name_with_suffix(entry.path().filename().string(), ".old");
          step && entry.is_directory() && has_done(entry.path().string()))
        out.push_back({*step, entry.path().string(), true});
  std::stable_sort(out.begin(), out.end(),
                   [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return out;
}

std::vector<std::string> retention_removals(const std::vector<CheckpointInfo>& listing, int64_t current_step, int keep,
                                            const std::string& protected_dir,
                                            const std::function<bool(const std::string&)>& verifies) {
  std::vector<std::string> remove;
  std::vector<CheckpointInfo> complete;
  for (const CheckpointInfo& c : listing) {
    if (c.step == current_step || c.path == protected_dir) continue;
    if (c.complete)
      complete.push_back(c);
    else
      remove.push_back(c.path);  // its write never finished: nothing in it is usable
  }
  if (keep == 0) return remove;
  std::sort(complete.begin(), complete.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step > b.step; });
  int kept = 1;  // the current checkpoint
  for (const CheckpointInfo& c : complete) {
    if (kept >= keep)
      remove.push_back(c.path);
    else if (verifies(c.path))
      kept++;
  }
  return remove;
}

std::vector<CheckpointInfo> checkpoints_left_behind(const std::vector<CheckpointInfo>& complete,
                                                    std::optional<int64_t> resume_step, bool resume_in_run_dir,
                                                    bool overwrite, const std::string& run_dir,
                                                    const std::string& resume_mode) {
  std::vector<CheckpointInfo> left;
  if (resume_step && resume_in_run_dir) {  // newer checkpoints than the resumed one: a rollback abandons them
    for (const CheckpointInfo& c : complete)
      if (c.step > *resume_step) left.push_back(c);
    return left;
  }
  if (complete.empty() || overwrite) return complete;
  const std::string what =
      resume_step ? strformat("checkpoint.resume = \"%s\" continues a checkpoint of another directory",
                              resume_mode.c_str())
                  : strformat("checkpoint.resume = \"%s\" starts a new run", resume_mode.c_str());
  throw_error("checkpoint.dir %s already holds %zu checkpoint(s) (the newest: %s) and %s: its checkpoints would mix "
              "with them and retention would remove them. Continue that run (checkpoint.resume=auto), choose another "
              "checkpoint.dir, or set checkpoint.overwrite=true to move them into %s (kept) and start over",
              run_dir.c_str(), complete.size(), complete.back().path.c_str(), what.c_str(),
              join(run_dir, kAbandonedDir).c_str());
}

std::string set_aside_checkpoints(const std::string& run_dir, const std::vector<CheckpointInfo>& dirs,
                                  const nlohmann::json& why) {
  const std::string parent = join(run_dir, kAbandonedDir);
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw_error("checkpoint: cannot create %s: %s (nothing was moved)", parent.c_str(), ec.message().c_str());
  const std::string stamp = utc_stamp();
  std::string aside = join(parent, stamp);
  for (int i = 2; fs::exists(aside, ec); i++) aside = join(parent, strformat("%s-%d", stamp.c_str(), i));
  if (!fs::create_directory(aside, ec) || ec)
    throw_error("checkpoint: cannot create %s: %s (nothing was moved)", aside.c_str(), ec.message().c_str());
  json note = why;
  note["time"] = stamp;
  note["moved"] = json::array();
  for (const CheckpointInfo& c : dirs) note["moved"].push_back(fs::path(c.path).filename().string());
  const std::string text = note.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  write_file_synced(join(aside, kSetAsideFile), text.data(), text.size());
  for (const CheckpointInfo& c : dirs) {
    const std::string to = join(aside, fs::path(c.path).filename().string());
    if (::rename(c.path.c_str(), to.c_str()) != 0)
      throw_error("checkpoint: cannot move %s to %s: %s (nothing was deleted; move it by hand or fix the permissions)",
                  c.path.c_str(), to.c_str(), std::strerror(errno));
  }
  fsync_dir(aside);
  fsync_dir(run_dir);
  return aside;
}

RunStart start_run(const std::string& resume_mode, const std::string& run_dir, bool overwrite) {
  RunStart start;
  if (!run_dir.empty() || (resume_mode != "auto" && resume_mode != "none"))
    start.resume_dir = resolve_resume(resume_mode, run_dir, &start.notes);
  std::optional<int64_t> resume_step;
  RunLineage& lineage = start.lineage;
  if (start.resume_dir) {
    const TrainerState state = load_trainer_state(*start.resume_dir);
    resume_step = state.step;
    lineage.run_id = state.run_id;
    lineage.resumed_from = lineage.parent = *start.resume_dir;
    lineage.verified[canonical_key(*start.resume_dir)] = true;  // resolve_resume verified it
  }
  if (lineage.run_id.empty()) {
    lineage.run_id = new_run_id();
    if (start.resume_dir)
      start.notes.push_back(strformat("%s records no run id (written before checkpoints recorded their lineage): "
                                      "this run continues as run %s", start.resume_dir->c_str(),
                                      lineage.run_id.c_str()));
  }
  if (run_dir.empty()) return start;

  const bool resume_in_run_dir = start.resume_dir && same_dir(run_dir_of(*start.resume_dir), run_dir);
  const std::vector<CheckpointInfo> left = checkpoints_left_behind(
      list_complete_checkpoints(run_dir), resume_step, resume_in_run_dir, overwrite, run_dir, resume_mode);
  if (left.empty()) return start;
  const bool rollback = resume_step && resume_in_run_dir;
  json why = {{"reason", rollback ? "rollback" : "overwrite"},
              {"run_id", lineage.run_id},
              {"resumed_from", start.resume_dir ? json(*start.resume_dir) : json(nullptr)}};
  const std::string aside = set_aside_checkpoints(run_dir, left, why);
  if (rollback)
    start.notes.push_back(strformat("rollback: resuming from step %lld, older than the newest checkpoint of %s; the "
                                    "line it abandons (%s) is moved to %s (kept, never resumed from automatically)",
                                    static_cast<long long>(*resume_step), run_dir.c_str(), names_of(left).c_str(),
                                    aside.c_str()));
  else
    start.notes.push_back(strformat("checkpoint.overwrite: the %zu checkpoint(s) already in %s (%s) are moved to %s "
                                    "(kept); this run starts over as run %s", left.size(), run_dir.c_str(),
                                    names_of(left).c_str(), aside.c_str(), lineage.run_id.c_str()));
  return start;
}

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir, std::vector<std::string>* notes) {
  if (run_dir.empty() || !is_dir(run_dir)) return std::nullopt;
  std::map<int64_t, std::string> complete, incomplete, old_complete;
  std::vector<std::string> tmp_dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    const std::string path = entry.path().string();
    if (auto step = parse_step_dir_name(name)) {
      (has_done(path) ? complete : incomplete)[*step] = path;
    } else if (auto old_step = parse_step_name_with_suffix(name, ".old")) {
      if (has_done(path)) old_complete[*old_step] = path;
    } else if (parse_step_name_with_suffix(name, ".tmp")) {
      tmp_dirs.push_back(path);
    }
  }
  // A complete .old stands in for its step when the replacement never finished (crash between rename and DONE).
  for (const auto& [step, path] : old_complete)
    if (!complete.count(step)) {
      complete[step] = path;
      if (notes)
        notes->push_back(strformat("using %s: the checkpoint that was replacing it did not finish", path.c_str()));
    }
  std::optional<std::string> latest;
  int64_t latest_step = -1;
  if (!complete.empty()) {
    latest = complete.rbegin()->second;
    latest_step = complete.rbegin()->first;
  }
  if (notes) {
    for (const auto& [step, path] : incomplete)
      if (step > latest_step)
        notes->push_back(strformat("skipping %s: no DONE marker (its write did not finish)", path.c_str()));
    std::sort(tmp_dirs.begin(), tmp_dirs.end());
    for (const std::string& path : tmp_dirs)
      notes->push_back(strformat("ignoring %s: an unfinished checkpoint write", path.c_str()));
  }
  return latest;
}

TrainerState load_trainer_state(const std::string& step_dir) {
  const std::string path = join(step_dir, kTrainerStateFile);
  std::string text;
  if (!read_text_file(path, &text))
    throw_error("checkpoint file %s is missing or unreadable (is %s a checkpoint step directory?)", path.c_str(),
                step_dir.c_str());
  TrainerState st;
  try {
    st.raw = parse_json(text, path);  // the nesting limit; a key twice is corruption too
  } catch (const JsonError& e) {
    throw_error("checkpoint file is corrupt: %s", e.what());
  }
  const json& j = st.raw;
  auto need = [&](const char* key, bool ok, const char* what) {
    if (!j.contains(key) || !ok)
      throw_error("checkpoint file %s is corrupt ('%s' missing or not %s)", path.c_str(), key, what);
  };
  if (!j.is_object()) throw_error("checkpoint file %s is corrupt (not a JSON object)", path.c_str());
  need("format_version", j.contains("format_version") && j["format_version"].is_number_integer(), "an integer");
  if (!j["format_version"].is_number_unsigned() || j["format_version"].get<uint64_t>() != kCheckpointFormatVersion)
    throw_error("checkpoint file %s has format_version %s, but this build reads version %d (hint: resume it with the "
                "llm8 version that wrote it)",
                path.c_str(), j["format_version"].dump().c_str(), kCheckpointFormatVersion);
  st.format_version = kCheckpointFormatVersion;
  need("step", j.contains("step") && j["step"].is_number_unsigned() &&
                   j["step"].get<uint64_t>() <= static_cast<uint64_t>(size_limits::kSteps),
       "a non-negative integer of at most 1000000000");
  st.step = j["step"].get<int64_t>();
  need("world_size", j.contains("world_size") && j["world_size"].is_number_unsigned() &&
                         j["world_size"].get<uint64_t>() >= 1 &&
                         j["world_size"].get<uint64_t>() <= static_cast<uint64_t>(kMaxWorldSize),
       "a positive integer of at most 1048576");
  st.world_size = j["world_size"].get<int>();
  need("files", j.contains("files") && j["files"].is_array(), "an array");
  if (j.contains("checksum") && j["checksum"] != "crc32c")
    throw_error("checkpoint file %s names an unknown checksum '%s' (this build knows crc32c)", path.c_str(),
                j["checksum"].dump().c_str());
  const std::pair<const char*, json*> opaque_fields[] = {
      {"rng", &st.rng}, {"data", &st.data}, {"config", &st.config}, {"extra", &st.extra}};
  for (const auto& [key, field] : opaque_fields)
    if (j.contains(key)) *field = j[key];
  // Lineage (absent in checkpoints that predate it).
  if (j.contains("run_id") && !j["run_id"].is_string())
    throw_error("checkpoint file %s is corrupt ('run_id' is not a string)", path.c_str());
  if (j.contains("parent") && !j["parent"].is_string() && !j["parent"].is_null())
    throw_error("checkpoint file %s is corrupt ('parent' is neither a string nor null)", path.c_str());
  st.run_id = j.value("run_id", std::string());
  if (j.contains("parent") && j["parent"].is_string()) st.parent = j["parent"].get<std::string>();
  for (const json& f : j["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("crc32c") || !f["crc32c"].is_string())
      throw_error("checkpoint file %s is corrupt (a 'files' entry needs name, bytes and crc32c)", path.c_str());
    CheckpointFile cf;
    cf.name = f["name"].get<std::string>();
    cf.bytes = f["bytes"].get<uint64_t>();
    const std::string hex = f["crc32c"].get<std::string>();
    char* end = nullptr;
    unsigned long v = std::strtoul(hex.c_str(), &end, 16);
    if (hex.size() != 8 || end != hex.c_str() + hex.size())
      throw_error("checkpoint file %s is corrupt (crc32c '%s' of %s is not 8 hex digits)", path.c_str(), hex.c_str(),
                  cf.name.c_str());
    if (cf.name.empty() || cf.name.find('/') != std::string::npos)
      throw_error("checkpoint file %s is corrupt (bad file name '%s')", path.c_str(), cf.name.c_str());
    cf.crc32c = uint32_t(v);
    st.files.push_back(cf);
  }
  return st;
}

namespace {

TrainerState verify_contents(const std::string& step_dir) {
  const std::string done_path = join(step_dir, kDoneFile);
  const std::string state_path = join(step_dir, kTrainerStateFile);
  std::string done;
  if (!read_text_file(done_path, &done))
    throw_error("checkpoint %s is incomplete (no DONE marker: its write did not finish)", step_dir.c_str());
  std::string state_text;
  if (!read_text_file(state_path, &state_text)) throw_error("checkpoint file %s is missing", state_path.c_str());
  if (done != done_contents(crc32c(state_text.data(), state_text.size())))
    throw_error("checkpoint file %s is corrupt (checksum mismatch with the DONE marker)", state_path.c_str());
  TrainerState st = load_trainer_state(step_dir);
  if (auto dir_step = step_of_dir(step_dir); dir_step && *dir_step != st.step)
    throw_error("checkpoint file %s is corrupt (step %lld, but the directory is named for step %lld)",
                state_path.c_str(), (long long)st.step, (long long)*dir_step);
  for (const CheckpointFile& f : st.files) {
    const std::string path = join(step_dir, f.name);
    if (!is_file(path)) throw_error("checkpoint file %s is missing", path.c_str());
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec || size != f.bytes)
      throw_error("checkpoint file %s is corrupt (%llu bytes, expected %llu: truncated?)", path.c_str(),
                  (unsigned long long)size, (unsigned long long)f.bytes);
    if (checksum_file(path, nullptr, /*fsync_it=*/false) != f.crc32c)
      throw_error("checkpoint file %s is corrupt (checksum mismatch)", path.c_str());
  }
  return st;
}

}  // namespace

TrainerState verify_checkpoint(const std::string& step_dir) {
  if (!is_dir(step_dir)) throw_error("checkpoint directory %s does not exist", step_dir.c_str());
  try {
    return verify_contents(step_dir);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + previous_checkpoint_hint(step_dir));
  }
}

std::optional<std::string> resolve_resume(const std::string& mode, const std::string& run_dir,
                                          std::vector<std::string>* notes) {
  if (mode == "none") return std::nullopt;
  if (mode.empty())
    throw_error("checkpoint.resume is empty: use auto, none, or the path of a step directory");
  if (mode == "auto") {
    std::optional<std::string> latest = find_latest_checkpoint(run_dir, notes);
    if (!latest) return std::nullopt;
    verify_checkpoint(*latest);
    return latest;
  }
  if (!fs::exists(mode))
    throw_error("checkpoint.resume: %s does not exist (hint: give a step directory like <run>/step_00000300, or auto "
                "/ none)",
                mode.c_str());
  if (!is_dir(mode))
    throw_error("checkpoint.resume: %s is not a directory (hint: give a step directory like <run>/step_00000300)",
                mode.c_str());
  if (!is_file(join(mode, kTrainerStateFile)) && !list_checkpoints(mode).empty())
    throw_error("checkpoint.resume: %s is a run directory, not a step directory (hint: name one of its step_NNNNNNNN "
                "directories, or set checkpoint.dir to it with checkpoint.resume=auto)",
                mode.c_str());
  if (!has_done(mode))
    throw_error("checkpoint.resume: %s is incomplete (no DONE marker: its write did not finish)%s", mode.c_str(),
                previous_checkpoint_hint(mode).c_str());
  verify_checkpoint(mode);
  return mode;
}

std::string world_size_mismatch_message(const std::string& step_dir, int saved_world_size, int current_world_size) {
  return strformat("checkpoint %s was written by %d rank(s) but this run has %d: the optimizer state is stored per "
                   "rank, so resume with %d rank(s), or start a new run from its weights only with "
                   "train.init_from=%s and checkpoint.resume=none",
                   step_dir.c_str(), saved_world_size, current_world_size, saved_world_size, step_dir.c_str());
}

void check_world_size(const TrainerState& state, int current_world_size, const std::string& step_dir) {
  if (state.world_size != current_world_size)
    throw Error(world_size_mismatch_message(step_dir, state.world_size, current_world_size));
}

}  // namespace llmc
