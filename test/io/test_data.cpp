// test/io/test_data: the token shard reader and the DataLoader of llmc/io/data. Shards are written by the test itself
// (uint16 and uint32 formats) with tokens whose value encodes (shard, position), so every window read back is checked
// exactly against an independent expectation: read_shard_header on valid and corrupt files (bad magic/version,
// truncated, shorter than the header, extra bytes; messages name the file), DataLoader construction errors, windows
// of T+1 tokens at stride T that never cross shards, batch order and epochs, disjoint equal slices for every rank
// (with and without shuffle), seeds, position()/restore() (also across epochs, through JSON text, and refused for
// other settings or malformed positions), the vocabulary guard, shuffled_window_order, the token check before the
// first step (a bad token in the middle of the third shard found whatever the threads, chunks and ranks; the first bad
// token reported; ranks cover every token once; progress lines; read errors; switched off, the batch check remains)
// and hostile shard files (a header lying about its size, FIFOs and directories, within time and memory bounds).
//
// Every loop below runs a fixed number of iterations (a batch count known up front); nothing waits for a condition.
// Checks that could block (FIFOs) run in a child process with a time limit.
#include <gtest/gtest.h>

#include "test/support/bounded_run.h"
#include "test/support/temp_dir.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "llmc/core/common.h"
#include "llmc/io/data.h"
#include "test/support/error_of.h"

namespace fs = std::filesystem;
using llmc_test::thrown_error;
using nlohmann::json;

namespace {

constexpr int32_t kMagic16 = 20240520, kVersion16 = 1;
constexpr int32_t kMagic32 = 20240801, kVersion32 = 7;
constexpr size_t kHeaderBytes = 256 * 4;
// Token value = base + shard * kShardStride + position in the shard (shards are shorter than kShardStride).
constexpr uint32_t kShardStride = 1000;
constexpr uint32_t kBase32 = 70000;  // uint32 shards hold values above 65535

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Writes a shard file with the given header fields (may be inconsistent on purpose), the tokens as
// bytes_per_token little-endian integers, then extra_bytes zero bytes.
void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int64_t count,
                     const std::vector<uint32_t>& tokens, int bytes_per_token, size_t extra_bytes = 0) {
  std::vector<unsigned char> bytes(kHeaderBytes, 0);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; k++) bytes[at + k] = static_cast<unsigned char>(v >> (8 * k));
  };
  put32(0, static_cast<uint32_t>(magic));
  put32(4, static_cast<uint32_t>(version));
  put32(8, static_cast<uint32_t>(static_cast<int32_t>(count)));
  for (uint32_t t : tokens)
    for (int k = 0; k < bytes_per_token; k++) bytes.push_back(static_cast<unsigned char>(t >> (8 * k)));
  bytes.insert(bytes.end(), extra_bytes, 0);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, bool u32) {
  write_raw_shard(path, u32 ? kMagic32 : kMagic16, u32 ? kVersion32 : kVersion16, static_cast<int64_t>(tokens.size()),
                  tokens, u32 ? 4 : 2);
}

std::vector<uint32_t> counting_tokens(uint32_t first, size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; i++) t[i] = first + static_cast<uint32_t>(i);
  return t;
}

// A set of position-encoded shards and the independent expectation of their windows.
struct Corpus {
  std::string glob;
  std::vector<std::string> paths;
  std::vector<size_t> sizes;         // tokens per shard
  std::vector<size_t> first_window;  // (num_shards + 1,) prefix sums of (size - 1) / T
  uint32_t base = 0;
  int T = 0;
  size_t total_tokens = 0;
  size_t total_windows() const { return first_window.back(); }

  // The first token of global window g: shard s, local window k -> base + s * stride + k * T.
  uint32_t first_token(size_t g) const {
    size_t s = 0;
    while (s + 1 < sizes.size() && first_window[s + 1] <= g) s++;  // bounded by the shard count
    return base + static_cast<uint32_t>(s) * kShardStride + static_cast<uint32_t>((g - first_window[s]) * T);
  }

  // The global window id of one (T,) row of inputs/targets, or -1 when the row is not exactly a window of T+1
  // consecutive tokens at a multiple of T inside one shard (targets = inputs shifted by one).
  long long window_id(const int* in, const int* tgt) const {
    const long long v = in[0];
    if (v < static_cast<long long>(base)) return -1;
    const size_t s = static_cast<size_t>(v - base) / kShardStride, p = static_cast<size_t>(v - base) % kShardStride;
    if (s >= sizes.size() || p % static_cast<size_t>(T) != 0 || p + static_cast<size_t>(T) >= sizes[s]) return -1;
    for (int t = 0; t < T; t++)
      if (in[t] != v + t || tgt[t] != v + t + 1) return -1;
    const size_t g = first_window[s] + p / static_cast<size_t>(T);
    return g < first_window[s + 1] ? static_cast<long long>(g) : -1;
  }
};

// One batch as read: the raw arrays and the decoded window ids.
struct Batch {
  std::vector<int> inputs, targets;  // (B, T)
  std::vector<long long> ids;        // (B,)
  bool operator==(const Batch& o) const { return inputs == o.inputs && targets == o.targets; }
};

// Reads exactly n batches (no other loop condition) and decodes every row; a row that is not a valid window fails.
std::vector<Batch> read_batches(llmc::DataLoader& dl, const Corpus& c, int B, size_t n) {
  std::vector<Batch> out;
  EXPECT_LE(n, 10000u);  // a sanity bound for these tiny corpora
  for (size_t i = 0; i < n && i < 10000; i++) {
    Batch b;
    b.inputs.assign(static_cast<size_t>(B) * c.T, -7);
    b.targets.assign(static_cast<size_t>(B) * c.T, -7);
    dl.next_batch(b.inputs.data(), b.targets.data());
    for (int r = 0; r < B; r++) {
      const long long id = c.window_id(b.inputs.data() + static_cast<size_t>(r) * c.T,
                                       b.targets.data() + static_cast<size_t>(r) * c.T);
      EXPECT_GE(id, 0) << "batch " << i << " row " << r << " is not a window: first token "
                       << b.inputs[static_cast<size_t>(r) * c.T];
      b.ids.push_back(id);
    }
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<long long> ids_of(const std::vector<Batch>& batches) {
  std::vector<long long> ids;
  for (const Batch& b : batches) ids.insert(ids.end(), b.ids.begin(), b.ids.end());
  return ids;
}

// The window ids of one full epoch (exactly batches_per_epoch() batches).
std::vector<long long> epoch_ids(llmc::DataLoader& dl, const Corpus& c, int B) {
  return ids_of(read_batches(dl, c, B, dl.batches_per_epoch()));
}

class DataTest : public llmc_test::TempDirTest {
 protected:


  // Shards <prefix>_00000i.bin of the given sizes; token = base + i * kShardStride + position.
  Corpus make_corpus(const std::string& prefix, const std::vector<size_t>& sizes, int T, bool u32 = false) {
    Corpus c;
    c.glob = dir_ + "/" + prefix + "_*.bin";
    c.sizes = sizes;
    c.base = u32 ? kBase32 : 0;
    c.T = T;
    c.first_window.push_back(0);
    // Written in reverse order: the loader must sort by name, not rely on the directory order.
    c.paths.resize(sizes.size());
    for (size_t i = sizes.size(); i-- > 0;) {
      c.paths[i] = path(prefix + "_00000" + std::to_string(i) + ".bin");
      write_shard(c.paths[i], counting_tokens(c.base + static_cast<uint32_t>(i) * kShardStride, sizes[i]), u32);
    }
    for (size_t s : sizes) {
      c.first_window.push_back(c.first_window.back() + (s - 1) / static_cast<size_t>(T));
      c.total_tokens += s;
    }
    return c;
  }

  // The standard corpus: windows 5 + 3 + 7 + 4 = 19 at T = 8 (shards 1 and 3 have leftover tokens; shard 1 holds a
  // multiple of T tokens, so a count of n / T instead of (n - 1) / T windows would read past its end).
  Corpus standard(bool u32 = false) { return make_corpus("std", {41, 32, 57, 34}, 8, u32); }

};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// read_shard_header

TEST_F(DataTest, HeaderValidUint16AndUint32) {
  write_shard(path("a.bin"), counting_tokens(0, 100), false);
  llmc::ShardInfo a = llmc::read_shard_header(path("a.bin"));
  EXPECT_EQ(a.path, path("a.bin"));
  EXPECT_EQ(a.bytes_per_token, 2);
  EXPECT_EQ(a.num_tokens, 100u);
  EXPECT_EQ(a.num_windows, 0u);

  write_shard(path("b.bin"), counting_tokens(kBase32, 37), true);
  llmc::ShardInfo b = llmc::read_shard_header(path("b.bin"));
  EXPECT_EQ(b.bytes_per_token, 4);
  EXPECT_EQ(b.num_tokens, 37u);

  write_shard(path("empty.bin"), {}, false);  // a header alone is a valid (empty) shard
  EXPECT_EQ(llmc::read_shard_header(path("empty.bin")).num_tokens, 0u);
}

TEST_F(DataTest, HeaderErrorsNameTheFile) {
  struct Case {
    const char* name;
    std::function<void(const std::string&)> write;
    const char* expect;  // a word the message must hold besides the path
  };
  const std::vector<uint32_t> ten = counting_tokens(0, 10);
  const std::vector<Case> cases = {
      {"bad_magic.bin", [&](const std::string& p) { write_raw_shard(p, 12345, 1, 10, ten, 2); }, "magic"},
      {"v7_uint16.bin", [&](const std::string& p) { write_raw_shard(p, kMagic16, 7, 10, ten, 2); }, "version"},
      {"v1_uint32.bin", [&](const std::string& p) { write_raw_shard(p, kMagic32, 1, 10, ten, 4); }, "version"},
      {"truncated.bin", [&](const std::string& p) { write_raw_shard(p, kMagic16, 1, 20, ten, 2); }, "truncated"},
      {"truncated32.bin", [&](const std::string& p) { write_raw_shard(p, kMagic32, 7, 10, ten, 2); }, "truncated"},
      {"extra.bin", [&](const std::string& p) { write_raw_shard(p, kMagic16, 1, 10, ten, 2, 1); }, "bytes"},
      {"negative.bin", [&](const std::string& p) { write_raw_shard(p, kMagic16, 1, -5, ten, 2); }, "negative"},
      {"short.bin", [&](const std::string& p) { std::ofstream(p, std::ios::binary) << std::string(100, 'x'); },
       "header"},
      {"zero.bin", [&](const std::string& p) { std::ofstream(p, std::ios::binary); }, "header"},
  };
  for (const Case& c : cases) {
    const std::string p = path(c.name);
    c.write(p);
    const std::string msg = thrown_error([&] { llmc::read_shard_header(p); });
    EXPECT_TRUE(contains(msg, p)) << c.name << ": " << msg;
    EXPECT_TRUE(contains(msg, c.expect)) << c.name << ": " << msg;
  }
  const std::string missing = path("missing.bin");
  const std::string msg = thrown_error([&] { llmc::read_shard_header(missing); });
  EXPECT_TRUE(contains(msg, missing) && contains(msg, "cannot open")) << msg;
}

// ---------------------------------------------------------------------------------------------------------------
// DataLoader construction

TEST_F(DataTest, EmptyGlobNamesThePattern) {
  const std::string pattern = path("nothing_*.bin");
  const std::string msg = thrown_error([&] { llmc::DataLoader(pattern, 1, 8, 0, 1, false, 0); });
  EXPECT_TRUE(contains(msg, pattern)) << msg;
  const std::string plain = path("no_such_file.bin");  // a pattern without wildcards that matches nothing
  EXPECT_TRUE(contains(thrown_error([&] { llmc::DataLoader(plain, 1, 8, 0, 1, false, 0); }), plain));
}

TEST_F(DataTest, ShardShorterThanTPlusOne) {
  Corpus c = make_corpus("s", {41, 8}, 8);  // the second shard has T tokens: too short
  const std::string msg = thrown_error([&] { llmc::DataLoader(c.glob, 1, 8, 0, 1, false, 0); });
  EXPECT_TRUE(contains(msg, c.paths[1])) << msg;
  EXPECT_FALSE(contains(msg, c.paths[0])) << msg;

  // Exactly T+1 tokens is one window.
  Corpus d = make_corpus("d", {9}, 8);
  llmc::DataLoader dl(d.glob, 1, 8, 0, 1, false, 0);
  EXPECT_EQ(dl.num_sequences(), 1u);
  EXPECT_EQ(dl.batches_per_epoch(), 1u);
  EXPECT_EQ(epoch_ids(dl, d, 1), (std::vector<long long>{0}));
}

TEST_F(DataTest, NotEnoughWindowsForOneBatchPerRank) {
  Corpus c = standard();  // 19 windows
  EXPECT_EQ(llmc::DataLoader(c.glob, 19, 8, 0, 1, false, 0).batches_per_epoch(), 1u);
  EXPECT_EQ(llmc::DataLoader(c.glob, 6, 8, 2, 3, false, 0).batches_per_epoch(), 1u);
  for (auto [B, world] : std::vector<std::pair<int, int>>{{20, 1}, {10, 2}, {7, 3}, {1, 20}}) {
    const std::string msg = thrown_error([&] { llmc::DataLoader(c.glob, B, 8, 0, world, false, 0); });
    EXPECT_TRUE(contains(msg, c.glob) && contains(msg, "19")) << "B=" << B << " world=" << world << ": " << msg;
  }
}

TEST_F(DataTest, InvalidShardOrMixedFormatsInTheGlob) {
  Corpus c = make_corpus("m", {41, 30}, 8);
  write_raw_shard(path("m_000002.bin"), 999, 1, 10, counting_tokens(0, 10), 2);
  std::string msg = thrown_error([&] { llmc::DataLoader(c.glob, 1, 8, 0, 1, false, 0); });
  EXPECT_TRUE(contains(msg, path("m_000002.bin")) && contains(msg, "magic")) << msg;

  write_shard(path("m_000002.bin"), counting_tokens(kBase32, 30), true);  // uint32 among uint16 shards
  msg = thrown_error([&] { llmc::DataLoader(c.glob, 1, 8, 0, 1, false, 0); });
  EXPECT_TRUE(contains(msg, path("m_000002.bin")) && contains(msg, "uint32")) << msg;
}

TEST_F(DataTest, BadArguments) {
  Corpus c = standard();
  EXPECT_THROW(llmc::DataLoader(c.glob, 0, 8, 0, 1, false, 0), llmc::Error);
  EXPECT_THROW(llmc::DataLoader(c.glob, 1, 0, 0, 1, false, 0), llmc::Error);
  EXPECT_THROW(llmc::DataLoader(c.glob, 1, 8, -1, 1, false, 0), llmc::Error);
  EXPECT_THROW(llmc::DataLoader(c.glob, 1, 8, 2, 2, false, 0), llmc::Error);
  EXPECT_THROW(llmc::DataLoader(c.glob, 1, 8, 0, 0, false, 0), llmc::Error);
}

TEST_F(DataTest, Counts) {
  Corpus c = standard();
  llmc::DataLoader dl(c.glob, 2, 8, 1, 2, false, 0);
  EXPECT_EQ(dl.total_tokens(), 41u + 32 + 57 + 34);
  EXPECT_EQ(dl.num_sequences(), 19u);
  EXPECT_EQ(dl.sequences_per_rank(), 9u);  // 19 / 2, the remainder dropped
  EXPECT_EQ(dl.batches_per_epoch(), 4u);   // 9 / 2, the partial batch dropped
  EXPECT_EQ(dl.vocab_limit(), 65536);
  EXPECT_EQ(dl.epoch(), 0);
  ASSERT_EQ(dl.shards().size(), 4u);
  const std::vector<size_t> windows = {5, 3, 7, 4};
  for (size_t i = 0; i < 4; i++) {
    EXPECT_EQ(dl.shards()[i].path, c.paths[i]);  // sorted by name
    EXPECT_EQ(dl.shards()[i].num_tokens, c.sizes[i]);
    EXPECT_EQ(dl.shards()[i].num_windows, windows[i]);
  }
  Corpus u = make_corpus("u", {41}, 8, true);
  EXPECT_EQ(llmc::DataLoader(u.glob, 1, 8, 0, 1, false, 0).vocab_limit(), INT32_MAX);
}

// ---------------------------------------------------------------------------------------------------------------
// Windows, batches, epochs

TEST_F(DataTest, WindowsAtStrideTNeverCrossShards) {
  for (bool u32 : {false, true}) {
    Corpus c = standard(u32);
    llmc::DataLoader dl(c.glob, 1, 8, 0, 1, false, 0);
    ASSERT_EQ(dl.batches_per_epoch(), 19u);
    std::vector<Batch> batches = read_batches(dl, c, 1, 19);
    for (size_t g = 0; g < 19; g++) {
      ASSERT_EQ(batches[g].ids[0], static_cast<long long>(g));
      // Independently: window g starts at c.first_token(g); inputs are its first T tokens, targets the next T.
      for (int t = 0; t < 8; t++) {
        EXPECT_EQ(batches[g].inputs[t], static_cast<int>(c.first_token(g)) + t) << "window " << g;
        EXPECT_EQ(batches[g].targets[t], static_cast<int>(c.first_token(g)) + t + 1) << "window " << g;
      }
    }
    // Spot checks: the last window of shard 0 ends at its last token; shard 1 starts at its token 0.
    EXPECT_EQ(batches[4].inputs[0], static_cast<int>(c.base) + 32);
    EXPECT_EQ(batches[4].targets[7], static_cast<int>(c.base) + 40);
    EXPECT_EQ(batches[5].inputs[0], static_cast<int>(c.base + kShardStride));
    EXPECT_EQ(batches[18].inputs[0], static_cast<int>(c.base + 3 * kShardStride) + 24);
  }
}

TEST_F(DataTest, OtherTAndB) {
  // T = 1: every token but the last starts a window; T = 5 with B = 3.
  for (int T : {1, 5}) {
    Corpus c = make_corpus("t" + std::to_string(T), {12, 7, 20}, T);
    const int B = T == 1 ? 4 : 3;
    llmc::DataLoader dl(c.glob, B, T, 0, 1, false, 0);
    ASSERT_EQ(dl.num_sequences(), c.total_windows());
    ASSERT_EQ(dl.batches_per_epoch(), c.total_windows() / B);
    std::vector<long long> ids = epoch_ids(dl, c, B);
    std::vector<long long> expect(c.total_windows() / B * B);
    std::iota(expect.begin(), expect.end(), 0);
    EXPECT_EQ(ids, expect) << "T=" << T;
  }
}

TEST_F(DataTest, BatchesInOrderAndEpochsRepeat) {
  Corpus c = standard();
  const int B = 2;
  llmc::DataLoader dl(c.glob, B, 8, 0, 1, false, 0);
  ASSERT_EQ(dl.batches_per_epoch(), 9u);
  std::vector<long long> expect(18);
  std::iota(expect.begin(), expect.end(), 0);  // window 18 is the dropped remainder

  std::vector<Batch> e0 = read_batches(dl, c, B, 9);
  EXPECT_EQ(ids_of(e0), expect);
  EXPECT_EQ(dl.epoch(), 0);
  EXPECT_EQ(dl.position()["epoch"], 1);  // the next batch is the first of epoch 1
  EXPECT_EQ(dl.position()["batch"], 0);

  std::vector<Batch> e1 = read_batches(dl, c, B, 9);
  EXPECT_EQ(dl.epoch(), 1);
  EXPECT_EQ(e1, e0);  // no shuffle: the same data again
  read_batches(dl, c, B, 1);
  EXPECT_EQ(dl.epoch(), 2);

  dl.reset();
  EXPECT_EQ(dl.epoch(), 0);
  EXPECT_EQ(dl.position()["batch"], 0);
  EXPECT_EQ(read_batches(dl, c, B, 9), e0);
}

// ---------------------------------------------------------------------------------------------------------------
// Ranks and shuffling

// For world sizes 1..3, the ranks' windows of one epoch are disjoint and equally many; without shuffle rank r takes
// windows r, r+N, ...; with shuffle positions r, r+N, ... of shuffled_window_order (checked for two epochs).
TEST_F(DataTest, RanksDisjointEqualCounts) {
  Corpus c = standard();
  const int B = 2;
  const uint64_t seed = 1234;
  for (bool shuffle : {false, true}) {
    for (int world = 1; world <= 3; world++) {
      for (int epoch = 0; epoch < 2; epoch++) {
        const std::vector<uint64_t> order = llmc::shuffled_window_order(c.total_windows(), seed, epoch);
        std::set<long long> all;
        size_t bpe = 0;
        for (int rank = 0; rank < world; rank++) {
          llmc::DataLoader dl(c.glob, B, 8, rank, world, shuffle, seed);
          if (rank == 0) bpe = dl.batches_per_epoch();
          ASSERT_EQ(dl.batches_per_epoch(), bpe) << "rank " << rank;
          ASSERT_EQ(bpe, 19u / world / B);
          if (epoch == 1) read_batches(dl, c, B, bpe);  // skip epoch 0
          std::vector<long long> ids = epoch_ids(dl, c, B);
          ASSERT_EQ(ids.size(), bpe * B);
          EXPECT_EQ(dl.epoch(), epoch);
          for (size_t i = 0; i < ids.size(); i++) {
            const size_t at = rank + i * world;
            EXPECT_EQ(ids[i], static_cast<long long>(shuffle ? order[at] : at))
                << "shuffle " << shuffle << " world " << world << " rank " << rank << " epoch " << epoch << " i " << i;
            EXPECT_TRUE(all.insert(ids[i]).second)
                << "window " << ids[i] << " seen twice (world " << world << ", shuffle " << shuffle << ")";
          }
        }
        EXPECT_EQ(all.size(), bpe * B * world);
      }
    }
  }
}

TEST_F(DataTest, ShuffleSeeds) {
  Corpus c = make_corpus("big", {201, 161, 97}, 4);  // 50 + 40 + 24 = 114 windows
  const int B = 3;
  auto first_epochs = [&](uint64_t seed) {
    llmc::DataLoader dl(c.glob, B, 4, 0, 1, true, seed);
    std::vector<long long> e0 = epoch_ids(dl, c, B);
    std::vector<long long> e1 = epoch_ids(dl, c, B);
    return std::make_pair(e0, e1);
  };
  auto [a0, a1] = first_epochs(7);
  auto [b0, b1] = first_epochs(7);
  auto [c0, c1] = first_epochs(8);
  EXPECT_EQ(a0, b0);
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, c0);
  EXPECT_NE(a0, a1);  // a new order every epoch
  std::vector<long long> identity(a0.size());
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a0, identity);
  // Each epoch visits distinct windows (114 / 3 = 38 batches: every window once).
  for (const auto* e : {&a0, &a1, &c0}) {
    std::vector<long long> sorted = *e;
    std::sort(sorted.begin(), sorted.end());
    std::vector<long long> all(114);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all);
  }
}

TEST(ShuffledWindowOrder, PermutationDeterministicPerEpochAndSeed) {
  for (size_t n : {0, 1, 2, 3, 19, 1000}) {
    std::vector<uint64_t> order = llmc::shuffled_window_order(n, 42, 0);
    ASSERT_EQ(order.size(), n);
    std::vector<uint64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < n; i++) ASSERT_EQ(sorted[i], i) << "n=" << n;
    EXPECT_EQ(llmc::shuffled_window_order(n, 42, 0), order);
  }
  const std::vector<uint64_t> base = llmc::shuffled_window_order(1000, 42, 0);
  EXPECT_NE(llmc::shuffled_window_order(1000, 42, 1), base);
  EXPECT_NE(llmc::shuffled_window_order(1000, 43, 0), base);
  EXPECT_NE(llmc::shuffled_window_order(1000, 42, 1), llmc::shuffled_window_order(1000, 42, 2));
  std::vector<uint64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(base, identity);
  // Seeds that differ only in high bits still give different orders.
  EXPECT_NE(llmc::shuffled_window_order(1000, 1ull << 63, 0), llmc::shuffled_window_order(1000, 0, 0));
}

// ---------------------------------------------------------------------------------------------------------------
// position() / restore()

namespace {

struct LoaderConfig {
  int B, T, rank, world;
  bool shuffle;
  uint64_t seed;
};

}  // namespace

TEST_F(DataTest, PositionFields) {
  Corpus c = standard();
  llmc::DataLoader dl(c.glob, 2, 8, 1, 2, true, 99);
  json p = dl.position();
  EXPECT_EQ(p["epoch"], 0);
  EXPECT_EQ(p["batch"], 0);
  EXPECT_EQ(p["B"], 2);
  EXPECT_EQ(p["T"], 8);
  EXPECT_EQ(p["rank"], 1);
  EXPECT_EQ(p["world_size"], 2);
  EXPECT_EQ(p["shuffle"], true);
  EXPECT_EQ(p["seed"], 99);
  read_batches(dl, c, 2, 3);
  EXPECT_EQ(dl.position()["epoch"], 0);
  EXPECT_EQ(dl.position()["batch"], 3);
  read_batches(dl, c, 2, dl.batches_per_epoch());
  EXPECT_EQ(dl.position()["epoch"], 1);
  EXPECT_EQ(dl.position()["batch"], 3);
}

// Save after k batches, read m more; a new loader restored from the saved JSON text gives exactly those m batches,
// and so does a loader that had already read other batches before restoring.
TEST_F(DataTest, RestoreResumesExactly) {
  Corpus c = standard();
  const std::vector<LoaderConfig> configs = {
      {2, 8, 0, 1, false, 0}, {2, 8, 0, 1, true, 5}, {2, 8, 2, 3, true, 0xFFFFFFFFFFFFFFFFull}, {1, 8, 1, 2, false, 3}};
  for (const LoaderConfig& cfg : configs) {
    const size_t bpe = llmc::DataLoader(c.glob, cfg.B, cfg.T, cfg.rank, cfg.world, cfg.shuffle, cfg.seed)
                           .batches_per_epoch();
    const std::vector<std::pair<size_t, size_t>> km = {
        {0, 3}, {2, 3}, {bpe - 1, bpe + 2}, {bpe, 2}, {2 * bpe + 1, bpe}, {3 * bpe - 1, 1}};
    for (auto [k, m] : km) {
      SCOPED_TRACE("B=" + std::to_string(cfg.B) + " rank=" + std::to_string(cfg.rank) + "/" +
                   std::to_string(cfg.world) + " shuffle=" + std::to_string(cfg.shuffle) + " k=" + std::to_string(k) +
                   " m=" + std::to_string(m));
      llmc::DataLoader a(c.glob, cfg.B, cfg.T, cfg.rank, cfg.world, cfg.shuffle, cfg.seed);
      read_batches(a, c, cfg.B, k);
      const std::string saved = a.position().dump();
      const std::vector<Batch> expect = read_batches(a, c, cfg.B, m);

      llmc::DataLoader fresh(c.glob, cfg.B, cfg.T, cfg.rank, cfg.world, cfg.shuffle, cfg.seed);
      fresh.restore(json::parse(saved));
      EXPECT_EQ(fresh.position().dump(), saved);
      EXPECT_EQ(read_batches(fresh, c, cfg.B, m), expect);

      llmc::DataLoader used(c.glob, cfg.B, cfg.T, cfg.rank, cfg.world, cfg.shuffle, cfg.seed);
      read_batches(used, c, cfg.B, 5);
      used.restore(json::parse(saved));
      EXPECT_EQ(read_batches(used, c, cfg.B, m), expect);
      EXPECT_EQ(used.epoch(), a.epoch());
    }
  }
}

TEST_F(DataTest, RestoreAtEpochEndEqualsNextEpochStart) {
  Corpus c = standard();
  llmc::DataLoader a(c.glob, 2, 8, 0, 1, true, 11);
  const size_t bpe = a.batches_per_epoch();
  read_batches(a, c, 2, bpe);
  const std::vector<Batch> expect = read_batches(a, c, 2, 3);
  llmc::DataLoader b(c.glob, 2, 8, 0, 1, true, 11);
  json p = b.position();
  p["batch"] = bpe;  // a position at the very end of epoch 0 is accepted
  b.restore(p);
  EXPECT_EQ(read_batches(b, c, 2, 3), expect);
  EXPECT_EQ(b.epoch(), 1);
}

TEST_F(DataTest, RestoreRefusesOtherSettings) {
  Corpus c = standard();
  Corpus other = make_corpus("other", {41, 32, 57, 35}, 8);  // one more token
  llmc::DataLoader a(c.glob, 2, 8, 1, 2, true, 7);
  read_batches(a, c, 2, 2);
  const json saved = json::parse(a.position().dump());
  struct Case {
    const char* what;
    std::string glob;
    LoaderConfig cfg;
  };
  const std::vector<Case> cases = {
      {"B", c.glob, {1, 8, 1, 2, true, 7}},          {"T", c.glob, {2, 4, 1, 2, true, 7}},
      {"rank", c.glob, {2, 8, 0, 2, true, 7}},       {"world_size", c.glob, {2, 8, 1, 3, true, 7}},
      {"shuffle", c.glob, {2, 8, 1, 2, false, 7}},   {"seed", c.glob, {2, 8, 1, 2, true, 8}},
      {"total_tokens", other.glob, {2, 8, 1, 2, true, 7}},
  };
  for (const Case& k : cases) {
    llmc::DataLoader b(k.glob, k.cfg.B, k.cfg.T, k.cfg.rank, k.cfg.world, k.cfg.shuffle, k.cfg.seed);
    const std::string msg = thrown_error([&] { b.restore(saved); });
    EXPECT_TRUE(contains(msg, k.what)) << k.what << ": " << msg;
  }
  // Fewer shards with the same settings.
  fs::remove(c.paths[3]);
  llmc::DataLoader fewer(c.glob, 2, 8, 1, 2, true, 7);
  EXPECT_TRUE(contains(thrown_error([&] { fewer.restore(saved); }), "num_shards"));
}

TEST_F(DataTest, RestoreRefusesMalformedPositions) {
  Corpus c = standard();
  llmc::DataLoader dl(c.glob, 2, 8, 0, 1, false, 0);
  const json good = dl.position();
  const size_t bpe = dl.batches_per_epoch();
  std::vector<std::pair<std::string, json>> cases;
  cases.push_back({"array", json::array({1, 2})});
  cases.push_back({"null", json()});
  cases.push_back({"empty object", json::object()});
  for (const char* key : {"epoch", "batch", "B", "T", "rank", "world_size", "shuffle", "seed", "num_shards",
                          "total_tokens"}) {
    json p = good;
    p.erase(key);
    cases.push_back({std::string("missing ") + key, p});
  }
  auto with = [&](const char* key, json v) {
    json p = good;
    p[key] = v;
    return p;
  };
  cases.push_back({"batch past the epoch", with("batch", bpe + 1)});
  cases.push_back({"negative batch", with("batch", -1)});
  cases.push_back({"negative epoch", with("epoch", -1)});
  cases.push_back({"huge epoch", with("epoch", 1ll << 40)});
  cases.push_back({"batch as string", with("batch", "3")});
  cases.push_back({"fractional epoch", with("epoch", 1.5)});
  cases.push_back({"B as string", with("B", "2")});
  for (const auto& [what, p] : cases) {
    const std::string msg = thrown_error([&] { dl.restore(p); });
    EXPECT_TRUE(contains(msg, "position")) << what << ": " << msg;
  }
  // The loader is still usable from a good position afterwards.
  dl.restore(good);
  EXPECT_EQ(read_batches(dl, c, 2, 1)[0].ids, (std::vector<long long>{0, 1}));
}

// ---------------------------------------------------------------------------------------------------------------
// The vocabulary guard

TEST_F(DataTest, VocabSizeGuardNamesTheShard) {
  Corpus c = standard();  // shard s holds tokens s * 1000 + position
  llmc::DataLoader dl(c.glob, 1, 8, 0, 1, false, 0);
  dl.set_vocab_size(1000);
  // Shard 0 (windows 0..4) is inside the vocabulary; the first window of shard 1 is not.
  read_batches(dl, c, 1, 5);
  const std::string msg = thrown_error([&] {
    std::vector<int> in(8), tgt(8);
    dl.next_batch(in.data(), tgt.data());
  });
  EXPECT_TRUE(contains(msg, c.paths[1]) && contains(msg, "1000")) << msg;

  // A bound above every token (the largest is 3033) reads a whole epoch; 0 switches the guard off.
  llmc::DataLoader ok(c.glob, 1, 8, 0, 1, false, 0);
  ok.set_vocab_size(3034);
  EXPECT_EQ(epoch_ids(ok, c, 1).size(), 19u);
  ok.set_vocab_size(3033);  // the last window (shard 3, tokens 3024..3032) is still inside; 3033 is never read
  EXPECT_EQ(epoch_ids(ok, c, 1).size(), 19u);
  ok.set_vocab_size(3032);
  read_batches(ok, c, 1, 18);
  EXPECT_TRUE(contains(thrown_error([&] {
                         std::vector<int> in(8), tgt(8);
                         ok.next_batch(in.data(), tgt.data());
                       }),
                       c.paths[3]));
  ok.set_vocab_size(0);
  ok.reset();
  EXPECT_EQ(epoch_ids(ok, c, 1).size(), 19u);
}

// ---------------------------------------------------------------------------------------------------------------
// The token check before the first step (DataLoader::check_tokens) and hostile shard files

namespace {

// Five uint16 (or uint32) shards of 100 tokens, all inside a vocabulary of V = 1000 (uint32: kBase32 + 1000, the
// tokens shifted by kBase32), except the positions TokenCheckTest::make writes a bad value to.
struct ScanCorpus {
  std::string glob;
  std::vector<std::string> paths;
  int V = 1000;
};

}  // namespace

class TokenCheckTest : public DataTest {
 protected:
  ScanCorpus make(const std::vector<std::pair<size_t, size_t>>& bad, uint32_t bad_value, bool u32 = false) {
    ScanCorpus c;
    c.glob = dir_ + "/scan_*.bin";
    const uint32_t base = u32 ? kBase32 : 0;
    c.V = static_cast<int>(base) + 1000;
    for (size_t s = 0; s < 5; s++) {
      std::vector<uint32_t> tokens(100);
      for (size_t i = 0; i < tokens.size(); i++) tokens[i] = base + static_cast<uint32_t>((s * 100 + i) % 1000);
      for (const auto& [shard, position] : bad)
        if (shard == s) tokens[position] = bad_value;
      c.paths.push_back(path("scan_00000" + std::to_string(s) + ".bin"));
      write_shard(c.paths.back(), tokens, u32);
    }
    return c;
  }
};

TEST_F(TokenCheckTest, BadTokenInTheMiddleOfTheThirdShardIsFoundUpFront) {
  for (bool u32 : {false, true}) {
    const uint32_t bad_value = u32 ? kBase32 + 1000 : 1000;  // the first id past the vocabulary
    const ScanCorpus c = make({{2, 50}}, bad_value, u32);
    // The loader builds without reading any token; the batches before the bad one are fine, so a run would have
    // stopped only at the batch holding it (16 batches of 1 x 8 tokens in).
    for (int threads : {1, 2, 3, 8}) {
      for (size_t chunk : {size_t(1), size_t(7), size_t(64), size_t(1) << 22}) {
        const llmc::DataLoader dl(c.glob, 1, 8, 0, 1, false, 0);
        llmc::TokenCheckOptions options;
        options.threads = threads;
        options.chunk_tokens = chunk;
        const std::string msg = thrown_error([&] { dl.check_tokens(c.V, options); });
        const std::string where = "threads " + std::to_string(threads) + ", chunk " + std::to_string(chunk);
        EXPECT_TRUE(contains(msg, "data shard '" + c.paths[2] + "': token " + std::to_string(bad_value) +
                                      " at position 50 is outside the model's vocabulary of " + std::to_string(c.V)))
            << where << ": " << msg;
      }
    }
    // The same corpus passes with a vocabulary that holds the value, and reports how many tokens it checked.
    const llmc::DataLoader dl(c.glob, 1, 8, 0, 1, false, 0);
    EXPECT_EQ(dl.check_tokens(c.V + 1), 500u);
  }
}

TEST_F(TokenCheckTest, TheFirstBadTokenIsReportedWhateverTheThreadsFinishFirst) {
  // Bad tokens late in shard 4, in the middle and near the start of shard 2 (the one reported), and at the last token
  // of shard 3 (a token no window ever reads: the scan still sees it).
  const ScanCorpus c = make({{4, 90}, {2, 60}, {2, 13}, {3, 99}}, 5000);
  for (int threads : {1, 4, 16}) {
    for (size_t chunk : {size_t(1), size_t(5), size_t(50), size_t(100), size_t(1000)}) {
      const llmc::DataLoader dl(c.glob, 1, 8, 0, 1, false, 0);
      llmc::TokenCheckOptions options;
      options.threads = threads;
      options.chunk_tokens = chunk;
      const std::string msg = thrown_error([&] { dl.check_tokens(1000, options); });
      EXPECT_TRUE(contains(msg, c.paths[2] + "': token 5000 at position 13 ")) << threads << "/" << chunk << ": " << msg;
    }
  }
  const ScanCorpus tail = make({{3, 99}}, 5000);
  const llmc::DataLoader dl(tail.glob, 1, 8, 0, 1, false, 0);
  EXPECT_TRUE(contains(thrown_error([&] { dl.check_tokens(1000); }), tail.paths[3] + "': token 5000 at position 99 "));
}

TEST_F(TokenCheckTest, RanksShareTheScanAndTogetherCoverEveryToken) {
  const ScanCorpus c = make({{2, 50}}, 1000);
  for (int world : {1, 2, 3, 5}) {
    for (size_t chunk : {size_t(10), size_t(30), size_t(100)}) {
      size_t checked = 0;
      int found = 0;
      for (int rank = 0; rank < world; rank++) {
        const llmc::DataLoader dl(c.glob, 1, 8, rank, world, false, 0);
        llmc::TokenCheckOptions options;
        options.chunk_tokens = chunk;
        checked += dl.check_tokens(1001, options);  // every token is inside
        std::string msg;  // stays empty when this rank's share has no bad token
        try {
          dl.check_tokens(1000, options);
        } catch (const llmc::Error& e) {
          msg = e.what();
        }
        if (!msg.empty()) {
          found++;
          EXPECT_TRUE(contains(msg, c.paths[2] + "': token 1000 at position 50 ")) << msg;
          // The rank that owns the chunk: chunk k of all chunks (in shard order) belongs to rank k % world.
          const size_t chunks_per_shard = (100 + chunk - 1) / chunk;
          EXPECT_EQ(static_cast<size_t>(rank), (2 * chunks_per_shard + 50 / chunk) % static_cast<size_t>(world));
        }
      }
      EXPECT_EQ(checked, 500u) << "world " << world << ", chunk " << chunk;
      EXPECT_EQ(found, 1) << "world " << world << ", chunk " << chunk;
    }
  }
}

TEST_F(TokenCheckTest, SwitchedOffTheBatchCheckStillCatchesTheToken) {
  // data.check_tokens = false: train_gpt does not call check_tokens; nothing else reads a token up front, and the
  // per-batch guard still stops at the batch that holds the bad one (shard 2's windows are 24..35 at T = 8: the
  // bad token at position 50 is in window 24 + 6 = 30).
  const ScanCorpus c = make({{2, 50}}, 1000);
  llmc::DataLoader dl(c.glob, 1, 8, 0, 1, false, 0);
  dl.set_vocab_size(1000);
  std::vector<int> in(8), tgt(8);
  for (int b = 0; b < 30; b++) dl.next_batch(in.data(), tgt.data());
  EXPECT_TRUE(contains(thrown_error([&] { dl.next_batch(in.data(), tgt.data()); }), c.paths[2] + "': token 1000 at "
                                                                                            "position 50 "));
  // uint16 shards cannot hold an id past a vocabulary of 65536 or more: nothing to scan.
  EXPECT_EQ(llmc::DataLoader(c.glob, 1, 8, 0, 1, false, 0).check_tokens(65536), 0u);
  EXPECT_EQ(llmc::DataLoader(c.glob, 1, 8, 0, 1, false, 0).check_tokens(65535), 500u);
}

TEST_F(TokenCheckTest, ProgressLinesForLongScans) {
  const ScanCorpus c = make({}, 0);
  const llmc::DataLoader dl(c.glob, 1, 8, 0, 1, false, 0);
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  llmc::TokenCheckOptions options;
  options.threads = 1;
  options.chunk_tokens = 50;
  options.progress = out;
  options.progress_interval_s = 0;  // a line after every chunk
  options.progress_min_bytes = 0;
  EXPECT_EQ(dl.check_tokens(1000, options), 500u);
  std::rewind(out);
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof buf, out)) text += buf;
  std::fclose(out);
  EXPECT_TRUE(contains(text, "data: checking every token of 5 shard(s) matching '" + c.glob + "'")) << text;
  EXPECT_TRUE(contains(text, "against the vocabulary of 1000 with 1 threads (data.check_tokens=false skips this)"))
      << text;
  EXPECT_TRUE(contains(text, "(50%")) << text;
  EXPECT_TRUE(contains(text, "data: all 500 tokens checked")) << text;
  // Below the size threshold: silent.
  std::FILE* quiet = std::tmpfile();
  options.progress = quiet;
  options.progress_min_bytes = 1001;  // the corpus is 1000 bytes of tokens
  dl.check_tokens(1000, options);
  EXPECT_EQ(std::ftell(quiet), 0);
  std::fclose(quiet);
}

TEST_F(TokenCheckTest, AShardTruncatedAfterOpeningIsAReadError) {
  const ScanCorpus c = make({}, 0);
  const llmc::DataLoader dl(c.glob, 1, 8, 0, 1, false, 0);
  ASSERT_EQ(::truncate(c.paths[3].c_str(), 1024 + 100), 0);
  const std::string msg = thrown_error([&] { dl.check_tokens(1000); });
  EXPECT_TRUE(contains(msg, c.paths[3]) && contains(msg, "end of file")) << msg;
}

TEST_F(DataTest, LyingHeadersAreCheckedAgainstTheFileBeforeAnyAllocation) {
  // A 1 KB file whose header claims 2^31 - 1 tokens: refused from the file size, quickly and without allocating.
  write_raw_shard(path("lying.bin"), kMagic32, kVersion32, INT32_MAX, {}, 4);
  llmc_test::expect_bounded_error([&] { llmc::read_shard_header(path("lying.bin")); },
                                  {path("lying.bin"), "truncated or corrupt"}, 1, 64ull << 20);
  llmc_test::expect_bounded_error([&] { llmc::DataLoader(dir_ + "/lying*.bin", 1, 8, 0, 1, false, 0); },
                                  {path("lying.bin"), "truncated or corrupt"}, 1, 64ull << 20);
}

TEST_F(DataTest, FifosAndDirectoriesAreRefusedWithoutBlocking) {
  write_shard(path("ok_000000.bin"), counting_tokens(0, 100), false);
  llmc_test::make_fifo(path("ok_000001.bin"));
  llmc_test::expect_bounded_error([&] { llmc::read_shard_header(path("ok_000001.bin")); },
                                  {"data shard '" + path("ok_000001.bin") + "' is a FIFO (named pipe), not a regular "
                                   "file"}, 2);
  llmc_test::expect_bounded_error([&] { llmc::DataLoader(dir_ + "/ok_*.bin", 1, 8, 0, 1, false, 0); },
                                  {path("ok_000001.bin"), "is a FIFO"}, 2);
  ASSERT_TRUE(fs::create_directory(path("dir_000000.bin")));
  llmc_test::expect_bounded_error([&] { llmc::DataLoader(dir_ + "/dir_*.bin", 1, 8, 0, 1, false, 0); },
                                  {path("dir_000000.bin"), "is a directory"}, 2);
}
