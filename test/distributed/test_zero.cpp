// test/distributed/test_zero: the CPU half of data parallelism's state handling: the ZeRO shard layout (ranges tile the
// buffer, every element has exactly one owner, pieces aligned for every optimizer state format, reductions are only
// started once the blocks they hold are final, most of every block is reduced during backward), the data position
// continued across world sizes (no window skipped), and partial safetensors reads. The optimizer state files written
// by N ranks and read back into any other world size are test/io/test_optimizer_files.
#include <gtest/gtest.h>

#include "test/support/temp_dir.h"

#include <algorithm>
#include <array>
#include <functional>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include <unistd.h>

#include "llmc/core/common.h"
#include "llmc/io/data.h"
#include "llmc/model/model_spec.h"
#include "llmc/io/safetensors.h"
#include "llmc/distributed/zero.h"
#include "llmc/io/optimizer_files.h"
#include "test/support/error_of.h"

namespace fs = std::filesystem;
using llmc_test::error_of;
using llmc::ElementRange;
using llmc::ParamTable;
using llmc::ShardLayout;

namespace {

ParamTable table_of(const std::string& preset) {
  llmc::ModelSpec spec;
  EXPECT_TRUE(llmc::model_preset(preset, &spec)) << preset;
  return llmc::build_param_table(spec);
}

std::string strformat_trace(bool shuffle, int w0, int b0, int w1, int b1) {
  return "shuffle " + std::to_string(shuffle) + ": " + std::to_string(w0) + "x" + std::to_string(b0) + " -> " +
         std::to_string(w1) + "x" + std::to_string(b1);
}

class TempDir : public llmc_test::TempDirTest {
};

}  // namespace

// GPT-2's offsets are multiples of large powers of two; an odd-sized model puts the block boundaries between the
// multiples of M, where the rounding direction matters.
ParamTable odd_table() {
  llmc::ModelSpec spec;
  llmc::model_preset("gpt2-tiny", &spec);
  spec.n_layer = 5;
  spec.n_head = 3;
  spec.n_kv_head = 3;
  spec.n_embd = 192;
  spec.ffn_hidden = 4 * 192;
  spec.max_seq_len = 100;
  spec.vocab_size = 1000;
  spec.padded_vocab_size = 1024;
  return llmc::build_param_table(spec);
}

// ------------------------------------------------------------------------------------------------------------------
// Layout

TEST(ShardLayout, TilesTheBufferAndEveryElementHasOneOwner) {
  // state alignment 1: the element-wise formats (pieces of 32); 128: fp8 / fp8_expand (whole groups of 128)
  for (size_t state_align : {size_t{1}, llmc::kMomentGroupSize})
  for (const char* preset : {"gpt2-tiny", "odd", "llama-tiny", "gpt2-124m"})
    for (int world : {1, 2, 3, 4, 5, 8}) {
      if (std::string(preset) == "gpt2-124m" && world != 3 && world != 8) continue;  // large: two worlds suffice
      SCOPED_TRACE(std::string(preset) + " world " + std::to_string(world) + " state alignment " +
                   std::to_string(state_align));
      const ParamTable table = std::string(preset) == "odd" ? odd_table() : table_of(preset);
      const ShardLayout L = llmc::make_shard_layout(table, world, state_align);
      EXPECT_EQ(L.align, state_align == 1 ? ShardLayout::kAlign : llmc::kMomentGroupSize);
      const size_t M = static_cast<size_t>(world) * L.align;
      EXPECT_EQ(L.total, table.total_elements);
      EXPECT_EQ(L.replicated_begin % M, 0u);
      EXPECT_LT(L.total - L.replicated_begin, M);
      size_t at = 0;
      for (const auto& r : L.ranges) {
        EXPECT_EQ(r.begin, at);
        EXPECT_LT(r.begin, r.end);
        EXPECT_EQ(r.begin % M, 0u);
        EXPECT_EQ(r.end % M, 0u);
        // layers = exactly the blocks of the tensors it overlaps
        std::set<int> expect;
        for (const auto& p : table.params)
          if (p.offset < r.end && p.offset + p.numel > r.begin) expect.insert(p.layer);
        if (expect.empty()) expect.insert(-1);
        EXPECT_EQ(std::set<int>(r.layers.begin(), r.layers.end()), expect);
        at = r.end;
      }
      EXPECT_EQ(at, L.replicated_begin);
      // owners: every element below replicated_begin exactly once over the ranks; the tail on every rank
      std::vector<int> owners(L.total, 0);
      size_t owned_total = 0;
      for (int r = 0; r < world; r++) {
        const auto pieces = L.owned(r);
        EXPECT_EQ(pieces.size(), L.ranges.size() + (L.replicated_begin < L.total ? 1 : 0));
        for (const ElementRange& p : pieces) {
          EXPECT_EQ(p.first % L.align, 0u);  // 128-byte aligned pieces (vectorised AdamW), whole groups
          if (p.second != L.total) EXPECT_EQ(p.second % L.align, 0u);
          for (size_t i = p.first; i < p.second; i++) owners[i]++;
        }
        owned_total += L.owned_elements(r);
      }
      for (size_t i = 0; i < L.replicated_begin; i++) ASSERT_EQ(owners[i], 1) << "element " << i;
      for (size_t i = L.replicated_begin; i < L.total; i++) ASSERT_EQ(owners[i], world) << "element " << i;
      EXPECT_EQ(owned_total, L.replicated_begin + world * (L.total - L.replicated_begin));
      // balanced: the ranks' shares differ only by the replicated tail
      EXPECT_EQ(L.owned_elements(0), L.owned_elements(world - 1));
    }
  EXPECT_NE(error_of([] { llmc::make_shard_layout(table_of("gpt2-tiny"), 0); }).find("world size 0"),
            std::string::npos);
  // every state format of this build gets a layout cut only at its alignment, and the element-wise formats keep the
  // layout of the builds before the grouped formats
  for (const llmc::StateFormat& f : llmc::state_formats()) {
    const ShardLayout L = llmc::make_shard_layout(table_of("gpt2-tiny"), 3, f.shard_alignment());
    EXPECT_EQ(L.align % f.shard_alignment(), 0u) << f.name;
    if (f.shard_alignment() == 1) EXPECT_EQ(L.to_json(), llmc::make_shard_layout(table_of("gpt2-tiny"), 3).to_json());
  }
}

// The schedule the optimizer runs: blocks report final from the last to the first, then -1 (the end of backward).
// A range starts when every block it holds has reported; check that this happens and that most of each block is
// reduced while backward still runs (the overlap), the embeddings at the end.
TEST(ShardLayout, ReductionsFollowBackwardAndOverlapIt) {
  for (const char* which : {"gpt2-124m", "odd", "llama-125m"})
  for (int world : {2, 3, 5, 7, 8}) {
    SCOPED_TRACE(std::string(which) + ", world " + std::to_string(world));
    const ParamTable table = std::string(which) == "odd" ? odd_table() : table_of(which);
    const ShardLayout L = llmc::make_shard_layout(table, world);
    int blocks = 0;
    for (const auto& p : table.params) blocks = std::max(blocks, p.layer + 1);
    std::vector<int> launched_at(L.ranges.size(), -2);  // the hook that launched it
    std::vector<bool> done(blocks, false);
    bool end = false;
    auto ready = [&](const llmc::ReduceRange& r) {
      return std::all_of(r.layers.begin(), r.layers.end(), [&](int l) { return l < 0 ? end : done[l]; });
    };
    for (int hook = blocks - 1; hook >= -1; hook--) {
      if (hook >= 0) done[hook] = true; else end = true;
      for (size_t k = 0; k < L.ranges.size(); k++)
        if (launched_at[k] == -2 && ready(L.ranges[k])) launched_at[k] = hook;
    }
    for (size_t k = 0; k < L.ranges.size(); k++) EXPECT_NE(launched_at[k], -2) << "range " << k << " never started";
    // per block: the share of its elements reduced at its own hook (not later)
    for (int l = 0; l < blocks; l++) {
      size_t total = 0, early = 0;
      for (const auto& p : table.params) {
        if (p.layer != l) continue;
        total += p.numel;
        for (size_t k = 0; k < L.ranges.size(); k++) {
          const size_t b = std::max(p.offset, L.ranges[k].begin), e = std::min(p.offset + p.numel, L.ranges[k].end);
          if (b < e && launched_at[k] >= l) early += e - b;
        }
      }
      EXPECT_GT(static_cast<double>(early), 0.99 * total) << "block " << l;
    }
    // what is left for the end of backward: the embeddings, the final norm and a few elements around them
    size_t at_end = 0, outside_blocks = 0;
    for (size_t k = 0; k < L.ranges.size(); k++)
      if (launched_at[k] == -1) at_end += L.ranges[k].end - L.ranges[k].begin;
    for (const auto& p : table.params)
      if (p.layer < 0) outside_blocks += p.numel;
    EXPECT_LE(at_end, outside_blocks + 4 * world * ShardLayout::kAlign + 2 * ParamTable::kAlign);
  }
}

TEST(ShardLayout, FingerprintNamesTheLayout) {
  EXPECT_EQ(llmc::param_table_fingerprint(table_of("gpt2-tiny")), llmc::param_table_fingerprint(table_of("gpt2-tiny")));
  EXPECT_NE(llmc::param_table_fingerprint(table_of("gpt2-tiny")), llmc::param_table_fingerprint(table_of("gpt2-mini")));
}

// ------------------------------------------------------------------------------------------------------------------
// Data position across world sizes

namespace {

void write_counting_shard(const std::string& path, size_t n) {
  std::vector<unsigned char> bytes(256 * 4, 0);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; k++) bytes[at + k] = static_cast<unsigned char>(v >> (8 * k));
  };
  put32(0, 20240520);
  put32(4, 1);
  put32(8, static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; i++) {
    bytes.push_back(static_cast<unsigned char>(i & 0xff));
    bytes.push_back(static_cast<unsigned char>((i >> 8) & 0xff));
  }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

// The windows (identified by their first token / T) a loader yields in its next `batches` batches.
std::vector<int> next_windows(llmc::DataLoader& d, int B, int T, int batches) {
  std::vector<int> in(static_cast<size_t>(B) * T), tg(in.size()), out;
  for (int b = 0; b < batches; b++) {
    d.next_batch(in.data(), tg.data());
    for (int s = 0; s < B; s++) out.push_back(in[static_cast<size_t>(s) * T] / T);
  }
  return out;
}

}  // namespace

TEST_F(TempDir, DataPositionContinuesAcrossWorldSizes) {
  const int T = 8;
  write_counting_shard(dir_ + "/d_000.bin", 97 * T + 1);  // 97 windows
  const std::string glob = dir_ + "/d_*.bin";
  for (bool shuffle : {false, true})
    for (auto [w0, b0, w1, b1] : std::vector<std::array<int, 4>>{{2, 4, 1, 4}, {1, 4, 2, 4}, {2, 3, 4, 2}, {3, 2, 2, 2}}) {
      SCOPED_TRACE(strformat_trace(shuffle, w0, b0, w1, b1));
      // run 1: w0 ranks x b0 sequences, 3 batches each; save rank 0's position
      std::set<int> seen;
      nlohmann::json saved;
      for (int r = 0; r < w0; r++) {
        llmc::DataLoader d(glob, b0, T, r, w0, shuffle, 7);
        for (int w : next_windows(d, b0, T, 3)) EXPECT_TRUE(seen.insert(w).second);
        if (r == 0) saved = d.position();
      }
      // run 2: w1 ranks x b1 sequences continue to the end of the epoch
      std::multiset<int> later;
      std::string note;
      for (int r = 0; r < w1; r++) {
        llmc::DataLoader d(glob, b1, T, r, w1, shuffle, 7);
        d.restore(llmc::continue_position(saved, d.position(), &note));
        const int left = static_cast<int>(d.batches_per_epoch()) - d.position()["batch"].get<int>();
        for (int w : next_windows(d, b1, T, left)) later.insert(w);
      }
      EXPECT_NE(note.find("data position re-derived for"), std::string::npos) << note;
      // nothing the first run had not seen is skipped (up to the windows the smaller per-rank split drops at the end
      // of the epoch), and what is seen twice is less than one global batch of run 2
      const size_t consumed = static_cast<size_t>(3 * b0 * w0), per_batch = static_cast<size_t>(b1 * w1);
      size_t repeated = 0;
      for (int w : later) repeated += seen.count(w);
      EXPECT_EQ(repeated, consumed % per_batch);
      std::set<int> all(seen);
      all.insert(later.begin(), later.end());
      const size_t usable = 97 / static_cast<size_t>(w1) / static_cast<size_t>(b1) * per_batch;
      EXPECT_GE(all.size(), usable);
    }
  // other data is refused
  llmc::DataLoader a(glob, 4, T, 0, 2, false, 7), b(glob, 4, T, 0, 1, true, 7);
  EXPECT_NE(error_of([&] { llmc::continue_position(a.position(), b.position(), nullptr); }).find("'shuffle' was false"),
            std::string::npos);
}

// ------------------------------------------------------------------------------------------------------------------
// Partial reads

TEST_F(TempDir, SafetensorsReadRange) {
  std::vector<float> x(100);
  std::iota(x.begin(), x.end(), 0.0f);
  llmc::SafetensorsWriter w;
  w.add("x", "F32", {100}, x.data(), x.size() * 4);
  w.write(dir_ + "/r.safetensors");
  llmc::SafetensorsReader r(dir_ + "/r.safetensors");
  std::vector<float> y(10);
  r.read_range("x", 37 * 4, y.data(), 10 * 4);
  for (int i = 0; i < 10; i++) EXPECT_EQ(y[i], 37.0f + i);
  EXPECT_NE(error_of([&] { r.read_range("x", 95 * 4, y.data(), 10 * 4); }).find("outside tensor 'x'"),
            std::string::npos);
}
