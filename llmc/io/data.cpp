// llmc/io/data.cpp: implementation of the shard reader, the DataLoader and its token scan declared in data.h (POSIX
// glob + pread; the scan runs on std::thread workers).
#include "llmc/io/data.h"

#include <fcntl.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include "llmc/core/common.h"
#include "llmc/core/file_io.h"
#include "llmc/core/input_safety.h"

namespace llmc {

namespace {

constexpr int kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);
constexpr int32_t kMagicUint16 = 20240520, kVersionUint16 = 1;
constexpr int32_t kMagicUint32 = 20240801, kVersionUint32 = 7;
const char* kPrepareHint = "python3 dev/data/prepare.py (e.g. --kjv for data/kjv/kjv_{train,val}_*.bin)";

}  // namespace

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; i++) paths.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) throw_error("data: cannot expand the glob '%s' (glob error %d)", pattern.c_str(), rc);
  std::sort(paths.begin(), paths.end());  // byte order, independent of the locale
  return paths;
}

namespace {

// Reads `count` tokens of a shard from token `first_token` into bytes (little-endian, info.bytes_per_token each).
void pread_tokens(int fd, const ShardInfo& info, size_t first_token, size_t count, std::vector<unsigned char>& bytes) {
  const size_t num_bytes = count * info.bytes_per_token;
  const off_t offset = static_cast<off_t>(kHeaderBytes + first_token * info.bytes_per_token);
  bytes.resize(num_bytes);
  const IoResult r = pread_fully(fd, bytes.data(), num_bytes, static_cast<uint64_t>(offset));
  if (!r.ok())
    throw_error("data shard '%s': read of %zu bytes at offset %lld failed (%s): was the file changed or truncated?",
                info.path.c_str(), num_bytes, static_cast<long long>(offset), r.what());
}

// Token i of bytes read by pread_tokens.
uint32_t token_at(const std::vector<unsigned char>& bytes, size_t i, int bytes_per_token) {
  const unsigned char* p = bytes.data() + i * bytes_per_token;
  return bytes_per_token == 2 ? static_cast<uint32_t>(p[0] | (p[1] << 8))
                              : static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                                    (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

[[noreturn]] void token_out_of_vocabulary(const ShardInfo& info, uint32_t token, size_t position, int V) {
  throw_error("data shard '%s': token %u at position %zu is outside the model's vocabulary of %d (hint: the shards "
              "were made with another tokenizer)", info.path.c_str(), token, position, V);
}

// splitmix64: a tiny, well-mixed 64-bit generator (Steele et al.); the same sequence everywhere.
uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform integer in [0, bound) without modulo bias (rejection of the short top range).
uint64_t uniform_below(uint64_t& state, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    uint64_t r = splitmix64_next(state);
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

std::vector<uint64_t> shuffled_window_order(size_t n, uint64_t seed, int epoch) {
  std::vector<uint64_t> order(n);  // (n,)
  for (size_t i = 0; i < n; i++) order[i] = i;
  uint64_t seed_state = seed, epoch_state = 0xD1B54A32D192ED03ull + static_cast<uint64_t>(epoch);
  uint64_t state = splitmix64_next(seed_state) ^ splitmix64_next(epoch_state);
  for (size_t i = n; i > 1; i--) {  // Fisher-Yates: swap i-1 with a uniform j in [0, i)
    size_t j = static_cast<size_t>(uniform_below(state, i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

ShardInfo read_shard_header(const std::string& path) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, "data shard", &size);
  int32_t header[kHeaderInts];  // (256,)
  const ssize_t got = ::pread(fd, header, kHeaderBytes, 0);
  const int read_errno = errno;
  ::close(fd);
  if (got < 0) throw_error("data shard '%s': cannot read (%s)", path.c_str(), std::strerror(read_errno));
  const size_t file_bytes = static_cast<size_t>(size);
  if (static_cast<size_t>(got) < kHeaderBytes)
    throw_error("data shard '%s': file is %zu bytes, smaller than the %zu-byte header: truncated or not a token "
                "shard (hint: re-create it with %s)", path.c_str(), file_bytes, kHeaderBytes, kPrepareHint);

  ShardInfo info;
  info.path = path;
  const int32_t magic = header[0], version = header[1], count = header[2];
  if (magic == kMagicUint16) {
    if (version != kVersionUint16)
      throw_error("data shard '%s': unsupported version %d for magic %d (expected %d, uint16 tokens)", path.c_str(),
                  version, magic, kVersionUint16);
    info.bytes_per_token = 2;
  } else if (magic == kMagicUint32) {
    if (version != kVersionUint32)
      throw_error("data shard '%s': unsupported version %d for magic %d (expected %d, uint32 tokens)", path.c_str(),
                  version, magic, kVersionUint32);
    info.bytes_per_token = 4;
  } else {
    throw_error("data shard '%s': bad magic %d (expected %d for uint16 or %d for uint32 tokens): not an llm.c token "
                "shard (hint: create shards with %s)", path.c_str(), magic, kMagicUint16, kMagicUint32, kPrepareHint);
  }
  if (count < 0) throw_error("data shard '%s': negative token count %d in the header", path.c_str(), count);
  info.num_tokens = static_cast<size_t>(count);
  const size_t expected_bytes = kHeaderBytes + info.num_tokens * info.bytes_per_token;
  if (file_bytes != expected_bytes)
    throw_error("data shard '%s': file is %zu bytes but its header says %zu tokens (%zu bytes): truncated or "
                "corrupt (hint: re-create it with %s)", path.c_str(), file_bytes, info.num_tokens, expected_bytes,
                kPrepareHint);
  return info;
}

DataLoader::DataLoader(const std::string& glob, int B, int T, int rank, int world_size, bool shuffle, uint64_t seed)
    : glob_(glob), B_(B), T_(T), rank_(rank), world_size_(world_size), shuffle_(shuffle), seed_(seed) {
  if (B < 1 || T < 1) throw_error("data: batch size B=%d and sequence length T=%d must be positive", B, T);
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw_error("data: rank %d is not in [0, world_size=%d)", rank, world_size);

  const std::vector<std::string> paths = expand_glob(glob);
  if (paths.empty())
    throw_error("data: no files match '%s' (hint: check the path, or prepare shards with %s)", glob.c_str(),
                kPrepareHint);

  first_window_.push_back(0);
  for (const std::string& path : paths) {
    ShardInfo info = read_shard_header(path);
    if (!shards_.empty() && info.bytes_per_token != shards_[0].bytes_per_token)
      throw_error("data shard '%s' holds %s tokens but '%s' holds %s tokens: all shards of '%s' must share one format",
                  path.c_str(), info.bytes_per_token == 2 ? "uint16" : "uint32", shards_[0].path.c_str(),
                  shards_[0].bytes_per_token == 2 ? "uint16" : "uint32", glob.c_str());
    if (info.num_tokens < static_cast<size_t>(T) + 1)
      throw_error("data shard '%s' has %zu tokens, fewer than T+1 = %d needed for one sequence (hint: lower "
                  "train.seq_len, or re-prepare with larger shards / more text)", path.c_str(), info.num_tokens, T + 1);
    info.num_windows = (info.num_tokens - 1) / static_cast<size_t>(T);
    total_tokens_ += info.num_tokens;
    total_windows_ += info.num_windows;
    first_window_.push_back(total_windows_);
    shards_.push_back(info);
  }

  const size_t windows_per_batch_all_ranks = static_cast<size_t>(B) * world_size;
  if (total_windows_ < windows_per_batch_all_ranks)
    throw_error("data: the %zu shard(s) matching '%s' hold %zu sequences of T+1 = %d tokens, but one batch per rank "
                "needs B x world_size = %d x %d = %zu (hint: lower train.micro_batch or train.seq_len, or add data)",
                shards_.size(), glob.c_str(), total_windows_, T + 1, B, world_size, windows_per_batch_all_ranks);
  windows_per_rank_ = total_windows_ / world_size;
  batches_per_epoch_ = windows_per_rank_ / B;

  for (const ShardInfo& info : shards_) {
    uint64_t size = 0;
    const int fd = open_regular_file(info.path, "data shard", &size);
    fds_.push_back(fd);
    if (size != kHeaderBytes + info.num_tokens * info.bytes_per_token)
      throw_error("data shard '%s' changed size while it was opened (%llu bytes now): was it being rewritten?",
                  info.path.c_str(), static_cast<unsigned long long>(size));
  }
  window_tokens_.resize(static_cast<size_t>(T) + 1);
  reset();
}

DataLoader::~DataLoader() {
  for (int fd : fds_) ::close(fd);
}

int DataLoader::vocab_limit() const { return shards_[0].bytes_per_token == 2 ? 65536 : INT_MAX; }

void DataLoader::reset() {
  epoch_ = 0;
  batch_ = 0;
  start_epoch(0);
}

void DataLoader::start_epoch(int epoch) {
  epoch_ = epoch;
  rank_windows_.resize(windows_per_rank_);
  if (shuffle_) {
    std::vector<uint64_t> order = shuffled_window_order(total_windows_, seed_, epoch);  // (total_windows_,)
    for (size_t i = 0; i < windows_per_rank_; i++) rank_windows_[i] = order[rank_ + i * world_size_];
  } else {
    for (size_t i = 0; i < windows_per_rank_; i++) rank_windows_[i] = rank_ + i * world_size_;
  }
}

void DataLoader::read_window(size_t global_window, std::vector<uint32_t>& tokens) const {
  // The shard holding this window: the last shard whose first window is <= global_window.
  size_t shard = std::upper_bound(first_window_.begin(), first_window_.end(), global_window) - first_window_.begin() - 1;
  const ShardInfo& info = shards_[shard];
  const size_t first_token = (global_window - first_window_[shard]) * static_cast<size_t>(T_);
  std::vector<unsigned char> bytes;
  pread_tokens(fds_[shard], info, first_token, tokens.size(), bytes);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = token_at(bytes, i, info.bytes_per_token);
  if (check_vocab_size_ > 0)
    for (size_t i = 0; i < tokens.size(); i++)
      if (tokens[i] >= static_cast<uint32_t>(check_vocab_size_))
        token_out_of_vocabulary(info, tokens[i], first_token + i, check_vocab_size_);
}

size_t DataLoader::check_tokens(int V, const TokenCheckOptions& options) const {
  if (V < 1) throw_error("data: the vocabulary size for the token check must be >= 1 (got %d)", V);
  if (options.chunk_tokens < 1) throw_error("data: TokenCheckOptions::chunk_tokens must be >= 1");
  const int bytes_per_token = shards_[0].bytes_per_token;
  if (bytes_per_token == 2 && V >= 65536) return 0;  // every uint16 token is in the vocabulary

  // This rank's chunks, in shard order: chunk k of all ranks' numbering belongs to rank k % world_size.
  struct Chunk {
    size_t shard, first, count;
  };
  std::vector<Chunk> chunks;
  size_t share_tokens = 0, index = 0;
  for (size_t s = 0; s < shards_.size(); s++)
    for (size_t first = 0; first < shards_[s].num_tokens; first += options.chunk_tokens, index++)
      if (index % static_cast<size_t>(world_size_) == static_cast<size_t>(rank_)) {
        const size_t count = std::min(options.chunk_tokens, shards_[s].num_tokens - first);
        chunks.push_back({s, first, count});
        share_tokens += count;
      }
  if (chunks.empty()) return 0;

  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>(options.threads > 0 ? static_cast<size_t>(options.threads)
                                                              : std::min(16u, hardware),
                                          chunks.size());
  const double share_gb = static_cast<double>(share_tokens) * bytes_per_token / 1e9;
  const bool report = options.progress && share_tokens * bytes_per_token >= options.progress_min_bytes;
  using clock = std::chrono::steady_clock;
  const clock::time_point start = clock::now();
  clock::time_point last_report = start;
  auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  if (report) {
    std::fprintf(options.progress, "data: checking every token of %s%zu shard(s) matching '%s' (%.1f GB) against "
                 "the vocabulary of %d with %zu threads (data.check_tokens=false skips this)\n",
                 world_size_ > 1 ? "this rank's share of " : "", shards_.size(), glob_.c_str(), share_gb, V, threads);
    std::fflush(options.progress);
  }

  std::atomic<size_t> next_chunk{0}, first_bad_chunk{SIZE_MAX};
  std::atomic<size_t> checked{0};
  std::mutex mutex;  // guards the three below
  size_t bad_chunk = SIZE_MAX, bad_position = 0;
  uint32_t bad_token = 0;
  std::exception_ptr failure;
  auto work = [&](bool reports) {
    std::vector<unsigned char> bytes;
    for (;;) {
      // Chunks are handed out in order: once one is past a chunk with a bad token, every later one is too.
      const size_t c = next_chunk.fetch_add(1);
      if (c >= chunks.size() || c > first_bad_chunk.load()) return;
      const Chunk& chunk = chunks[c];
      const ShardInfo& info = shards_[chunk.shard];
      try {
        pread_tokens(fds_[chunk.shard], info, chunk.first, chunk.count, bytes);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
        first_bad_chunk = 0;  // stop everyone
        return;
      }
      for (size_t i = 0; i < chunk.count; i++) {
        const uint32_t token = token_at(bytes, i, bytes_per_token);
        if (token < static_cast<uint32_t>(V)) continue;
        const std::lock_guard<std::mutex> lock(mutex);
        if (c < bad_chunk) {
          bad_chunk = c;
          bad_position = chunk.first + i;
          bad_token = token;
          first_bad_chunk = c;
        }
        return;
      }
      checked += chunk.count;
      if (reports && seconds_since(last_report) >= options.progress_interval_s) {
        last_report = clock::now();
        std::fprintf(options.progress, "data: checked %.1f of %.1f GB of tokens (%.0f%%, %.0f s)\n",
                     static_cast<double>(checked.load()) * bytes_per_token / 1e9, share_gb,
                     100.0 * static_cast<double>(checked.load()) / static_cast<double>(share_tokens),
                     seconds_since(start));
        std::fflush(options.progress);
      }
    }
  };
  std::vector<std::thread> workers;
  try {
    for (size_t t = 1; t < threads; t++) workers.emplace_back(work, false);
  } catch (const std::system_error&) {  // no more threads to be had: the ones started (and this one) do the work
  }
  work(report);
  for (std::thread& w : workers) w.join();

  if (failure) std::rethrow_exception(failure);
  if (bad_chunk != SIZE_MAX) token_out_of_vocabulary(shards_[chunks[bad_chunk].shard], bad_token, bad_position, V);
  if (report) {
    std::fprintf(options.progress, "data: all %zu tokens checked in %.0f s\n", share_tokens, seconds_since(start));
    std::fflush(options.progress);
  }
  return share_tokens;
}

void DataLoader::next_batch(int* inputs, int* targets) {
  if (batch_ == batches_per_epoch_) {
    start_epoch(epoch_ + 1);
    batch_ = 0;
  }
  for (int b = 0; b < B_; b++) {
    read_window(rank_windows_[batch_ * B_ + b], window_tokens_);  // (T+1,)
    int* in = inputs + static_cast<size_t>(b) * T_;                  // (T,)
    int* out = targets + static_cast<size_t>(b) * T_;                // (T,)
    for (int t = 0; t < T_; t++) {
      in[t] = static_cast<int>(window_tokens_[t]);
      out[t] = static_cast<int>(window_tokens_[t + 1]);
    }
  }
  batch_++;
}

nlohmann::json DataLoader::position() const {
  // After the last batch of an epoch the next batch is the first of the next epoch: report it that way.
  const bool epoch_done = batch_ == batches_per_epoch_;
  return nlohmann::json{{"epoch", epoch_done ? epoch_ + 1 : epoch_},
                        {"batch", epoch_done ? 0 : batch_},
                        {"B", B_},
                        {"T", T_},
                        {"rank", rank_},
                        {"world_size", world_size_},
                        {"shuffle", shuffle_},
                        {"seed", seed_},
                        {"num_shards", shards_.size()},
                        {"total_tokens", total_tokens_}};
}

void DataLoader::restore(const nlohmann::json& pos) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!pos.is_object() || !pos.contains(key))
      throw_error("data: the saved data position has no '%s' (got %s): not a position from DataLoader::position()",
                  key, pos.dump().c_str());
    return pos.at(key);
  };
  auto expect = [&](const char* key, const nlohmann::json& now) {
    if (field(key) != now)
      throw_error("data: the saved data position has %s = %s but this run has %s for '%s': resuming needs the same "
                  "data, batch size, sequence length, shuffle, seed and world size", key, field(key).dump().c_str(),
                  now.dump().c_str(), glob_.c_str());
  };
  expect("B", B_);
  expect("T", T_);
  expect("rank", rank_);
  expect("world_size", world_size_);
  expect("shuffle", shuffle_);
  expect("seed", seed_);
  expect("num_shards", shards_.size());
  expect("total_tokens", total_tokens_);
  const nlohmann::json& epoch = field("epoch");
  const nlohmann::json& batch = field("batch");
  if (!epoch.is_number_integer() || epoch.get<long long>() < 0 || epoch.get<long long>() > INT_MAX ||
      !batch.is_number_integer() || batch.get<long long>() < 0 ||
      batch.get<unsigned long long>() > batches_per_epoch_)
    throw_error("data: the saved data position {epoch: %s, batch: %s} is out of range (%zu batches per epoch)",
                epoch.dump().c_str(), batch.dump().c_str(), batches_per_epoch_);
  start_epoch(epoch.get<int>());
  batch_ = batch.get<size_t>();
}

nlohmann::json continue_position(const nlohmann::json& saved, const nlohmann::json& current, std::string* note) {
  auto field = [](const nlohmann::json& pos, const char* key, const char* which) -> const nlohmann::json& {
    if (!pos.is_object() || !pos.contains(key))
      throw_error("data: the %s data position has no '%s' (got %s)", which, key, pos.dump().c_str());
    return pos.at(key);
  };
  for (const char* key : {"T", "shuffle", "seed", "num_shards", "total_tokens"})
    if (field(saved, key, "saved") != field(current, key, "current"))
      throw_error("data: cannot continue the saved data position: '%s' was %s and is %s now (resuming needs the same "
                  "data, sequence length, shuffle and seed)", key, saved.at(key).dump().c_str(),
                  current.at(key).dump().c_str());
  const auto number = [&](const nlohmann::json& pos, const char* key, const char* which) {
    const nlohmann::json& v = field(pos, key, which);
    if (!v.is_number_integer() || v.get<long long>() < 0)
      throw_error("data: the %s data position has %s = %s, not a non-negative integer", which, key, v.dump().c_str());
    return static_cast<unsigned long long>(v.get<long long>());
  };
  const unsigned long long consumed =
      number(saved, "batch", "saved") * number(saved, "B", "saved") * number(saved, "world_size", "saved");
  const unsigned long long per_batch = number(current, "B", "current") * number(current, "world_size", "current");
  if (per_batch == 0) throw_error("data: the current data position has B * world_size = 0");
  nlohmann::json out = current;
  out["epoch"] = field(saved, "epoch", "saved");
  out["batch"] = consumed / per_batch;
  if (note)
    *note = strformat("data position re-derived for %llu rank(s) x %llu sequences (saved by %llu x %llu): epoch %s, "
                      "%llu windows of the epoch consumed, continuing at batch %llu%s",
                      number(current, "world_size", "current"), number(current, "B", "current"),
                      number(saved, "world_size", "saved"), number(saved, "B", "saved"), out["epoch"].dump().c_str(),
                      consumed, consumed / per_batch,
                      consumed % per_batch ? strformat(" (%llu windows are seen again)", consumed % per_batch).c_str()
                                           : "");
  return out;
}

}  // namespace llmc
