// llmc/io/data.h: token shards in llm.c's format and the per-rank, deterministic, resumable data loader.
//
// Shard format: a header of 256 little-endian int32 (h[0] = 20240520, h[1] = 1, h[2] = token count, then uint16
// tokens; or h[0] = 20240801, h[1] = 7 with uint32 tokens), written by dev/data/prepare.py.
//
// Sampling: each shard is cut into windows of T+1 tokens at stride T (the last token of one window is the first of
// the next); windows never cross shards and are numbered globally in shard order (shards sorted by file name).
// Every epoch has an order of all windows: the identity, or with shuffle a permutation seeded by (seed, epoch).
// Rank r of N takes the windows at positions r, r+N, r+2N, ... of that order (every rank gets the same count, the
// remainder is dropped), so ranks are disjoint and deterministic; a batch is B consecutive windows of the rank's
// sequence (a partial last batch is dropped). After the last batch of an epoch the next epoch starts.
//
// Token ids: check_tokens scans every token of the shards against the vocabulary before training (multithreaded,
// each rank its share); next_batch checks the tokens of every batch it reads again when set_vocab_size was called.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llmc {

// The parsed header of one shard file.
struct ShardInfo {
  std::string path;
  int bytes_per_token = 2;  // 2 (uint16, version 1) or 4 (uint32, version 7)
  size_t num_tokens = 0;    // h[2]
  size_t num_windows = 0;   // windows of T+1 tokens at stride T: (num_tokens - 1) / T
};

// The files matching a glob pattern, sorted in byte order (the shard order); empty when none match.
std::vector<std::string> expand_glob(const std::string& pattern);

// Reads and validates one shard's header against its file size; throws llmc::Error naming the file (also for a path
// that is not a regular file: a FIFO, a directory). num_windows is left 0 (it depends on T).
ShardInfo read_shard_header(const std::string& path);

// How DataLoader::check_tokens works through the shards.
struct TokenCheckOptions {
  int threads = 0;                    // worker threads; 0 = the hardware's, at most 16
  size_t chunk_tokens = size_t(1) << 22;  // tokens per unit of work (one read)
  std::FILE* progress = nullptr;      // where long scans say what they do: a line at the start, every
  double progress_interval_s = 5.0;   // progress_interval_s and at the end, for shares of at least
  size_t progress_min_bytes = size_t(1) << 30;  // this many bytes of tokens
};

class DataLoader {
 public:
  // glob: shard files, e.g. "data/kjv/kjv_train_*.bin". B sequences of T tokens per batch. rank / world_size: this
  // process's slice. shuffle: a new seeded permutation of the windows every epoch. Throws llmc::Error when no file
  // matches, a shard is invalid or too short, or there are fewer windows than one batch per rank.
  DataLoader(const std::string& glob, int B, int T, int rank, int world_size, bool shuffle, uint64_t seed);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Fills host arrays inputs (B, T) and targets (B, T) = inputs shifted by one token; advances the position.
  void next_batch(int* inputs, int* targets);

  // The position of the next batch: {"epoch", "batch"} plus what identifies the data and the slicing (checked by
  // restore). restore(position()) makes the following next_batch calls identical to those after position().
  nlohmann::json position() const;
  void restore(const nlohmann::json& pos);  // throws llmc::Error if pos belongs to other data, B, T, rank or world
  void reset();                             // back to the first batch of epoch 0

  // Optional guard: with V > 0, next_batch throws llmc::Error (naming the shard) on a token >= V.
  void set_vocab_size(int V) { check_vocab_size_ = V; }

  // Checks every token of this rank's share of the shards against the vocabulary of V tokens: the shards are cut into
  // chunks of options.chunk_tokens, numbered in shard order, and rank r of N scans chunks r, r+N, r+2N, ... (one
  // rank scans all of them; all ranks together scan every token once), with several threads. The first bad token of
  // the share (lowest shard, then position) is an llmc::Error naming the shard, the position in it, the value and V.
  // Returns the number of tokens checked (0 when no token of the format can be >= V: uint16 shards and V >= 65536).
  size_t check_tokens(int V, const TokenCheckOptions& options = {}) const;

  size_t total_tokens() const { return total_tokens_; }          // tokens in all shards
  size_t num_sequences() const { return total_windows_; }        // windows of T+1 tokens in all shards (all ranks)
  size_t sequences_per_rank() const { return windows_per_rank_; }  // windows this rank visits per epoch
  size_t batches_per_epoch() const { return batches_per_epoch_; }  // batches this rank gets per epoch
  int vocab_limit() const;  // exclusive bound the shard format allows: 65536 for uint16, INT32_MAX for uint32
  int epoch() const { return epoch_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }

 private:
  void start_epoch(int epoch);  // builds this rank's window list for the epoch
  void read_window(size_t global_window, std::vector<uint32_t>& tokens) const;  // (T+1,)

  std::string glob_;
  int B_, T_, rank_, world_size_;
  bool shuffle_;
  uint64_t seed_;
  int check_vocab_size_ = 0;

  std::vector<ShardInfo> shards_;
  std::vector<int> fds_;                  // one open file descriptor per shard
  std::vector<size_t> first_window_;      // (num_shards + 1,) prefix sums of num_windows
  size_t total_tokens_ = 0, total_windows_ = 0, windows_per_rank_ = 0, batches_per_epoch_ = 0;

  int epoch_ = -1;                        // epoch whose window list is built
  size_t batch_ = 0;                      // next batch within epoch_
  std::vector<uint64_t> rank_windows_;    // (windows_per_rank_,) this rank's global window ids for epoch_
  std::vector<uint32_t> window_tokens_;   // (T+1,) scratch
};

// Resuming with another world size (or micro-batch): where a loader continues a run that saved `saved` (any saved
// rank's DataLoader::position(), e.g. rank 0's). `current` is this loader's own position() (it supplies this rank's
// rank, world size and B). All saved ranks were at batch b of epoch e, so together they had consumed the first
// b * B_saved * world_saved windows of that epoch's order; this loader continues at batch
// floor(consumed / (B * world_size)) of the same epoch: no window of the epoch is skipped, and when the division is not
// exact the remainder (less than one global batch) is seen again. *note (when given) describes the re-derivation.
// llmc::Error when the data, T, shuffle or seed differ.
nlohmann::json continue_position(const nlohmann::json& saved, const nlohmann::json& current, std::string* note);

// The deterministic permutation used for shuffling: a Fisher-Yates shuffle of 0..n-1 driven by splitmix64 seeded
// from (seed, epoch). Identical on every platform and standard library (no std::shuffle / distributions).
std::vector<uint64_t> shuffled_window_order(size_t n, uint64_t seed, int epoch);

}  // namespace llmc
