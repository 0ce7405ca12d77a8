// test/io/test_optimizer_files: the optimizer state in a checkpoint (llmc/io/optimizer_files.h) for every optimizer
// state format: fp32 files byte for byte those of the builds before optimizer.state_format (a golden writer below
// writes them the old way), bf16 files holding BF16 tensors and the format, files written by N ranks (ZeRO-1 shards)
// or by name (one rank, ZeRO-0) read back into any other world size (re-sharding), checkpoints of another format
// converted on load with a note, old checkpoints (no format metadata) loaded as fp32, a whole checkpoint of two ranks
// loaded for init and export, and the errors that name the file.
#include <gtest/gtest.h>

#include "test/support/temp_dir.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>

#include "llmc/core/common.h"
#include "llmc/core/dtypes.h"
#include "llmc/distributed/zero.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/interop.h"
#include "llmc/io/optimizer_files.h"
#include "llmc/io/safetensors.h"
#include "llmc/model/model_spec.h"
#include "test/support/error_of.h"

namespace fs = std::filesystem;
using llmc_test::error_of;
using llmc::ElementRange;
using llmc::ParamTable;
using llmc::ShardLayout;
using llmc::StateFormat;
using llmc::StoredMoments;

namespace {

class OptimizerFiles : public llmc_test::TempDirTest {};

ParamTable table_of(const std::string& preset) {
  llmc::ModelSpec spec;
  EXPECT_TRUE(llmc::model_preset(preset, &spec)) << preset;
  return llmc::build_param_table(spec);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A synthetic optimizer state of the whole table: distinct values everywhere (gaps included, to see they are not
// confused with tensor elements), most of them not representable in bf16 (so a conversion shows).
struct FullState {
  std::vector<float> master, m, v;
  explicit FullState(size_t n) : master(n), m(n), v(n) {
    for (size_t i = 0; i < n; i++) {
      master[i] = 0.5f + static_cast<float>(i);
      m[i] = -static_cast<float>(i) * 0.25f - 1e-3f;
      v[i] = static_cast<float>(i % 1009) * 1e-3f + 1.0f / 3.0f;
    }
  }
};

std::vector<ElementRange> whole(const ParamTable& table) { return {{0, table.total_elements}}; }

// The values of `ranges`, concatenated.
std::vector<float> gather(const std::vector<float>& full, const std::vector<ElementRange>& ranges) {
  std::vector<float> out;
  for (const ElementRange& r : ranges)
    out.insert(out.end(), full.begin() + static_cast<long>(r.first), full.begin() + static_cast<long>(r.second));
  return out;
}

// The moments of `ranges` as `format` stores them.
StoredMoments stored(const FullState& full, const std::vector<ElementRange>& ranges, const StateFormat& format) {
  const std::vector<float> m = gather(full.m, ranges), v = gather(full.v, ranges);
  StoredMoments s = StoredMoments::zeros(format, m.size());
  llmc::encode_moment(format.m, m.data(), m.size(), s.m.data());
  llmc::encode_moment(format.v, v.data(), v.size(), s.v.data());
  return s;
}

size_t elements(const std::vector<ElementRange>& ranges) {
  size_t n = 0;
  for (const ElementRange& r : ranges) n += r.second - r.first;
  return n;
}

// The n values a moment's storage block holds.
std::vector<float> decoded(const std::vector<uint8_t>& block, const llmc::MomentStorage& storage, size_t n) {
  EXPECT_EQ(block.size(), storage.bytes(n));
  std::vector<float> x(n);
  llmc::decode_moment(storage, block.data(), n, x.data());
  return x;
}

// Writes a checkpoint's optimizer files as `world` ranks at `stage` would, through write_optimizer_snapshot.
llmc::TrainerState write_state(const std::string& dir, const ParamTable& table, const FullState& full, int world,
                               int stage, const StateFormat& format) {
  const ShardLayout L = llmc::make_shard_layout(table, world, format.shard_alignment());
  for (int r = 0; r < world; r++) {
    llmc::OptimizerSnapshot s;
    s.table = &table;
    s.rank = r;
    s.world_size = world;
    s.zero_stage = stage;
    s.moments.format = format;
    if (r == 0) s.master_full = full.master;
    if (stage == 0 || world == 1) {
      s.kind = "full";
      if (r == 0) s.moments = stored(full, whole(table), format);
    } else {
      s.kind = "sharded";
      s.layout = L.to_json();
      s.owned = L.owned(r);
      s.master = gather(full.master, s.owned);
      s.moments = stored(full, s.owned, format);
    }
    llmc::write_optimizer_snapshot(s, dir);
  }
  llmc::TrainerState st;
  st.world_size = world;
  return st;
}

// The optimizer files exactly as the builds before optimizer.state_format wrote them (FP32 moments, no format
// metadata), plus `extra` metadata in every moment file (to forge broken files).
void write_previous_build(const std::string& dir, const ParamTable& table, const FullState& full, int world, int stage,
                          const std::map<std::string, std::string>& extra = {}) {
  auto by_name = [&](const std::string& path, const std::vector<float>& values, const std::string& content,
                     bool moments) {
    llmc::SafetensorsWriter w;
    for (const llmc::ParamInfo& p : table.params)
      w.add(p.name, "F32", p.shape, values.data() + p.offset, p.numel * sizeof(float));
    w.set_metadata("format", "llm8");
    w.set_metadata("content", content);
    if (moments)
      for (const auto& [k, v] : extra) w.set_metadata(k, v);
    w.write(path);
  };
  by_name(dir + "/model.safetensors", full.master, "fp32 master weights", false);
  if (stage == 0 || world == 1) {
    by_name(dir + "/optimizer_m.safetensors", full.m, "adamw first moment, fp32", true);
    by_name(dir + "/optimizer_v.safetensors", full.v, "adamw second moment, fp32", true);
    return;
  }
  const ShardLayout L = llmc::make_shard_layout(table, world);
  for (int r = 0; r < world; r++) {
    const std::vector<ElementRange> owned = L.owned(r);
    const std::vector<float> master = gather(full.master, owned), m = gather(full.m, owned),
                             v = gather(full.v, owned);
    llmc::SafetensorsWriter w;
    const int64_t n = static_cast<int64_t>(m.size());
    w.add("master", "F32", {n}, master.data(), master.size() * sizeof(float));
    w.add("m", "F32", {n}, m.data(), m.size() * sizeof(float));
    w.add("v", "F32", {n}, v.data(), v.size() * sizeof(float));
    nlohmann::json pieces = nlohmann::json::array();
    for (const ElementRange& p : owned) pieces.push_back({p.first, p.second});
    w.set_metadata("format", "llm8");
    w.set_metadata("content", "adamw state of one rank (ZeRO-1): fp32 master weights, first and second moment of "
                              "the flat-buffer pieces listed in 'pieces', concatenated in that order");
    w.set_metadata("rank", std::to_string(r));
    w.set_metadata("world_size", std::to_string(world));
    w.set_metadata("zero_stage", std::to_string(stage));
    w.set_metadata("total_elements", std::to_string(table.total_elements));
    w.set_metadata("table_fingerprint", nlohmann::json(llmc::param_table_fingerprint(table)).dump());
    w.set_metadata("pieces", pieces.dump());
    w.set_metadata("layout", L.to_json().dump());
    for (const auto& [k, val] : extra) w.set_metadata(k, val);
    w.write(dir + "/" + llmc::optimizer_shard_file(r));
  }
}

// Is element i inside a tensor (not an alignment gap)?
std::vector<bool> tensor_mask(const ParamTable& table) {
  std::vector<bool> in(table.total_elements, false);
  for (const auto& p : table.params) std::fill(in.begin() + p.offset, in.begin() + p.offset + p.numel, true);
  return in;
}

const std::vector<std::pair<int, int>> kSavedBy = {{2, 1}, {3, 1}, {1, 0}, {2, 0}};  // (world size, stage)

std::string saved_by(int world, int stage) {
  return "saved by " + std::to_string(world) + " rank(s), stage " + std::to_string(stage);
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// The files

TEST_F(OptimizerFiles, Fp32FilesAreByteForByteThoseOfThePreviousBuild) {
  const ParamTable table = table_of("gpt2-tiny");
  const FullState full(table.total_elements);
  for (auto [world, stage] : kSavedBy) {
    SCOPED_TRACE(saved_by(world, stage));
    const std::string now = path("now_" + std::to_string(world) + std::to_string(stage)),
                      before = path("before_" + std::to_string(world) + std::to_string(stage));
    fs::create_directories(now);
    fs::create_directories(before);
    write_state(now, table, full, world, stage, StateFormat::fp32());
    write_previous_build(before, table, full, world, stage);
    std::set<std::string> names_now, names_before;
    for (const auto& e : fs::directory_iterator(now)) names_now.insert(e.path().filename().string());
    for (const auto& e : fs::directory_iterator(before)) names_before.insert(e.path().filename().string());
    EXPECT_EQ(names_now, names_before);
    for (const std::string& name : names_before)
      EXPECT_TRUE(read_file(now + "/" + name) == read_file(before + "/" + name)) << name << " differs";
    // and explicitly: F32 moments, no format key
    const std::string moment_file = stage == 1 ? llmc::optimizer_shard_file(0) : llmc::kMomentFiles[0];
    llmc::SafetensorsReader reader(now + "/" + moment_file);
    for (const llmc::TensorEntry& e : reader.tensors()) EXPECT_EQ(e.dtype, "F32") << e.name;
    EXPECT_EQ(reader.metadata().count(llmc::kStateFormatKey), 0u);
  }
}

TEST_F(OptimizerFiles, Bf16FilesHoldBf16MomentsAndTheirFormat) {
  const ParamTable table = table_of("gpt2-tiny");
  const FullState full(table.total_elements);
  for (auto [world, stage] : kSavedBy) {
    SCOPED_TRACE(saved_by(world, stage));
    const std::string dir = path("bf16_" + std::to_string(world) + std::to_string(stage)),
                      fp32_dir = path("fp32_" + std::to_string(world) + std::to_string(stage));
    fs::create_directories(dir);
    fs::create_directories(fp32_dir);
    write_state(dir, table, full, world, stage, StateFormat::bf16());
    write_state(fp32_dir, table, full, world, stage, StateFormat::fp32());
    // the master weights do not depend on the moments' format
    EXPECT_TRUE(read_file(dir + "/" + llmc::kModelFile) == read_file(fp32_dir + "/" + llmc::kModelFile));
    std::vector<std::string> moment_files;
    if (stage == 1) {
      for (int r = 0; r < world; r++) moment_files.push_back(llmc::optimizer_shard_file(r));
    } else {
      moment_files = {llmc::kMomentFiles[0], llmc::kMomentFiles[1]};
    }
    for (const std::string& name : moment_files) {
      llmc::SafetensorsReader reader(dir + "/" + name);
      ASSERT_EQ(reader.metadata().count(llmc::kStateFormatKey), 1u) << name;
      EXPECT_EQ(reader.metadata().at(llmc::kStateFormatKey), "bf16") << name;
      for (const llmc::TensorEntry& e : reader.tensors())
        EXPECT_EQ(e.dtype, e.name == "master" ? "F32" : "BF16") << name << " " << e.name;
      // half the bytes of the fp32 file's moments
      llmc::SafetensorsReader fp32_reader(fp32_dir + "/" + name);
      for (const llmc::TensorEntry& e : reader.tensors())
        if (e.name != "master") EXPECT_EQ(2 * e.nbytes, fp32_reader.entry(e.name).nbytes) << e.name;
    }
    // the codes are bf16_rn of the values
    llmc::SafetensorsReader reader(dir + "/" + moment_files[0]);
    const std::string tensor = stage == 1 ? "m" : table.params[0].name;
    const std::vector<float> got = reader.read_as_float(tensor);
    const std::vector<float> want =
        stage == 1 ? gather(full.m, llmc::make_shard_layout(table, world).owned(0))
                   : gather(full.m, {{table.params[0].offset, table.params[0].offset + table.params[0].numel}});
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++)
      ASSERT_EQ(got[i], llmc::bf16_decode(llmc::bf16_encode(want[i]))) << tensor << " " << i;
  }
}

TEST_F(OptimizerFiles, DescriptionNamesTheStateFormat) {
  const ParamTable table = table_of("gpt2-tiny");
  llmc::OptimizerSnapshot s;
  s.table = &table;
  s.kind = "full";
  s.moments.format = StateFormat::bf16();
  const nlohmann::json d = llmc::describe_optimizer_snapshot(s);
  EXPECT_EQ(d["format"], "full");
  EXPECT_EQ(d["state_format"], "bf16");
  EXPECT_EQ(d["files"], nlohmann::json({"optimizer_m.safetensors", "optimizer_v.safetensors"}));
}

// ------------------------------------------------------------------------------------------------------------------
// Reading back

// Every rank of every new world size gets exactly the moments of its pieces, in the format they were saved in.
TEST_F(OptimizerFiles, ReshardsToAnyWorldSizeInEveryFormat) {
  const ParamTable table = table_of("gpt2-tiny");
  const FullState full(table.total_elements);
  const std::vector<bool> in_tensor = tensor_mask(table);
  for (const StateFormat& format : llmc::state_formats())
    for (auto [saved_world, saved_stage] : kSavedBy) {
      SCOPED_TRACE(std::string(format.name) + ", " + saved_by(saved_world, saved_stage));
      const std::string dir =
          path(std::string(format.name) + "_" + std::to_string(saved_world) + "_" + std::to_string(saved_stage));
      fs::create_directories(dir);
      const llmc::TrainerState st = write_state(dir, table, full, saved_world, saved_stage, format);
      EXPECT_EQ(fs::exists(dir + "/optimizer_rank00000.safetensors"), saved_stage == 1);
      EXPECT_EQ(fs::exists(dir + "/optimizer_m.safetensors"), saved_stage == 0);
      // model.safetensors: the full master weights by name, as train.init_from reads them
      std::vector<float> master(table.total_elements, 0.0f);
      llmc::read_param_tensors(dir + "/" + llmc::kModelFile, table, master.data());
      for (size_t i = 0; i < master.size(); i++)
        if (in_tensor[i]) ASSERT_EQ(master[i], full.master[i]) << i;
      const StoredMoments all = stored(full, whole(table), format);
      const size_t total = table.total_elements;
      const std::vector<float> all_m = decoded(all.m, format.m, total), all_v = decoded(all.v, format.v, total);
      for (int world : {1, 2, 4, 5}) {
        const ShardLayout L = llmc::make_shard_layout(table, world, format.shard_alignment());
        for (int r = 0; r < world; r++) {
          const std::vector<ElementRange> want = world == 1 ? whole(table) : L.owned(r);
          std::string note = "stale";
          const StoredMoments got = llmc::read_optimizer_moments(dir, st, table, want, format, &note);
          EXPECT_TRUE(note.empty()) << note;
          ASSERT_TRUE(got.format == format);
          const size_t n = elements(want);
          const std::vector<float> m = decoded(got.m, format.m, n), v = decoded(got.v, format.v, n);
          size_t at = 0;
          for (const ElementRange& p : want)
            for (size_t i = p.first; i < p.second; i++, at++) {
              // the by-name files of element-wise formats hold tensors only (gaps read as 0); shards and the flat
              // files of grouped formats hold gaps too
              const bool known = in_tensor[i] || saved_stage == 1 || format.m.grouped();
              ASSERT_EQ(m[at], known ? all_m[i] : 0.0f) << "world " << world << " rank " << r << " element " << i;
              ASSERT_EQ(v[at], known ? all_v[i] : 0.0f) << "world " << world << " rank " << r << " element " << i;
            }
          ASSERT_EQ(at, m.size());
          ASSERT_EQ(got.m.size(), format.m.bytes(at));
        }
      }
    }
}

// A checkpoint of another state format is converted once on load (decoded to FP32, encoded to the run's format), and
// the note says so; re-sharded at the same time.
TEST_F(OptimizerFiles, ConvertsAnotherStateFormatOnLoadWithANote) {
  const ParamTable table = table_of("gpt2-tiny");
  const FullState full(table.total_elements);
  const std::vector<bool> in_tensor = tensor_mask(table);
  for (const StateFormat& saved : llmc::state_formats())
    for (const StateFormat& run : llmc::state_formats()) {
      if (saved == run) continue;
      for (auto [saved_world, saved_stage] : kSavedBy) {
        SCOPED_TRACE(std::string(saved.name) + " -> " + run.name + ", " + saved_by(saved_world, saved_stage));
        const std::string dir = path(std::string(saved.name) + "_to_" + run.name + "_" + std::to_string(saved_world) +
                                     "_" + std::to_string(saved_stage));
        fs::create_directories(dir);
        const llmc::TrainerState st = write_state(dir, table, full, saved_world, saved_stage, saved);
        const ShardLayout L = llmc::make_shard_layout(table, 2, run.shard_alignment());
        const std::vector<ElementRange> want = L.owned(1);
        const llmc::OptimizerStateFiles files = llmc::read_optimizer_state(dir, st, table, want, run);
        EXPECT_EQ(files.note, std::string("optimizer state: checkpoint has ") + saved.name + " moments, this run " +
                                  run.name + ": converted");
        ASSERT_TRUE(files.moments.format == run);
        // expected: the saved codes, decoded, encoded in the run's format
        const StoredMoments saved_all = stored(full, whole(table), saved);
        const size_t total = table.total_elements;
        std::vector<float> m_all = decoded(saved_all.m, saved.m, total), v_all = decoded(saved_all.v, saved.v, total);
        for (size_t i = 0; i < m_all.size(); i++)  // by name (element-wise formats): gaps are not saved
          if (!in_tensor[i] && saved_stage == 0 && !saved.m.grouped()) m_all[i] = v_all[i] = 0.0f;
        FullState as_saved(0);
        as_saved.m = m_all;
        as_saved.v = v_all;
        const StoredMoments expect = stored(as_saved, want, run);
        EXPECT_TRUE(files.moments.m == expect.m) << "m";
        EXPECT_TRUE(files.moments.v == expect.v) << "v";
        // bf16 -> fp32 widens exactly; fp32 -> bf16 rounds to nearest even
        if (run == StateFormat::bf16() && saved == StateFormat::fp32()) {
          const std::vector<float> m = decoded(files.moments.m, run.m, elements(want)), exact = gather(full.m, want);
          size_t rounded = 0;
          for (size_t i = 0; i < m.size(); i++) {
            ASSERT_EQ(m[i], llmc::bf16_decode(llmc::bf16_encode(exact[i]))) << i;
            rounded += m[i] != exact[i];
          }
          EXPECT_GT(rounded, m.size() / 2);  // most values were not bf16: the conversion did round
        }
      }
    }
}

// Checkpoints of the builds before optimizer.state_format (no format metadata) load as fp32, exactly, and into a bf16
// run with the conversion note.
TEST_F(OptimizerFiles, PreviousBuildCheckpointsLoad) {
  const ParamTable table = table_of("gpt2-tiny");
  const FullState full(table.total_elements);
  const std::vector<bool> in_tensor = tensor_mask(table);
  for (auto [saved_world, saved_stage] : kSavedBy) {
    SCOPED_TRACE(saved_by(saved_world, saved_stage));
    const std::string dir = path("old_" + std::to_string(saved_world) + "_" + std::to_string(saved_stage));
    fs::create_directories(dir);
    write_previous_build(dir, table, full, saved_world, saved_stage);
    llmc::TrainerState st;
    st.world_size = saved_world;
    for (int world : {1, 3}) {
      const ShardLayout L = llmc::make_shard_layout(table, world);
      const std::vector<ElementRange> want = world == 1 ? whole(table) : L.owned(world - 1);
      const llmc::OptimizerStateFiles files = llmc::read_optimizer_state(dir, st, table, want, StateFormat::fp32());
      EXPECT_TRUE(files.note.empty()) << files.note;
      for (size_t i = 0; i < table.total_elements; i++)
        if (in_tensor[i]) ASSERT_EQ(files.master_full[i], full.master[i]) << i;
      const std::vector<float> m = decoded(files.moments.m, StateFormat::fp32().m, files.moments.m.size() / 4),
                               v = decoded(files.moments.v, StateFormat::fp32().v, files.moments.v.size() / 4);
      size_t at = 0;
      for (const ElementRange& p : want)
        for (size_t i = p.first; i < p.second; i++, at++) {
          const bool known = in_tensor[i] || saved_stage == 1;
          ASSERT_EQ(m[at], known ? full.m[i] : 0.0f) << i;
          ASSERT_EQ(v[at], known ? full.v[i] : 0.0f) << i;
        }
      const llmc::OptimizerStateFiles as_bf16 = llmc::read_optimizer_state(dir, st, table, want, StateFormat::bf16());
      EXPECT_EQ(as_bf16.note, "optimizer state: checkpoint has fp32 moments, this run bf16: converted");
      EXPECT_EQ(as_bf16.moments.m.size(), 2 * at);
    }
  }
}

// A whole checkpoint written as 2 ZeRO-1 ranks would (rank 0's CheckpointWriter, every rank's files in its tmp dir,
// one commit) verifies, and its model.safetensors is what train.init_from and the Hugging Face / llm.c exports read
// (llmc/io/interop's load_weights).
TEST_F(OptimizerFiles, CheckpointOfTwoRanksLoadsForInitAndExport) {
  llmc::ModelSpec spec;
  ASSERT_TRUE(llmc::model_preset("gpt2-tiny", &spec));
  const ParamTable table = llmc::build_param_table(spec);
  const FullState full(table.total_elements);
  for (const StateFormat& format : llmc::state_formats()) {
    SCOPED_TRACE(format.name);
    llmc::CheckpointWriter writer(path(std::string("run_") + format.name), 5);
    llmc::TrainerState st = write_state(writer.tmp_dir(), table, full, 2, 1, format);
    st.step = 5;
    const std::string step_dir = writer.commit(st, 0);
    const llmc::TrainerState verified = llmc::verify_checkpoint(step_dir);
    EXPECT_EQ(verified.world_size, 2);
    EXPECT_EQ(verified.files.size(), 3u);  // model.safetensors and one optimizer shard per rank
    std::vector<float> values(table.total_elements, 0.0f);
    const std::string what = llmc::load_weights(step_dir, spec, values.data());
    EXPECT_NE(what.find("model.safetensors"), std::string::npos) << what;
    const std::vector<bool> in_tensor = tensor_mask(table);
    for (size_t i = 0; i < values.size(); i++)
      if (in_tensor[i]) ASSERT_EQ(values[i], full.master[i]) << i;
  }
}

TEST_F(OptimizerFiles, ErrorsNameTheFile) {
  const ParamTable table = table_of("gpt2-tiny");
  const FullState full(table.total_elements);
  llmc::TrainerState st = write_state(dir_, table, full, 2, 1, StateFormat::fp32());
  std::string note;
  const std::vector<ElementRange> all = whole(table);
  const StateFormat& fp32 = StateFormat::fp32();
  auto read = [&](const ParamTable& t, const std::vector<ElementRange>& want) {
    return error_of([&] { llmc::read_optimizer_moments(dir_, st, t, want, fp32, &note); });
  };
  // a shard missing
  fs::rename(dir_ + "/optimizer_rank00001.safetensors", dir_ + "/moved.safetensors");
  std::string msg = read(table, all);
  EXPECT_NE(msg.find("optimizer_rank00001.safetensors (it was written by 2 rank(s))"), std::string::npos) << msg;
  fs::rename(dir_ + "/moved.safetensors", dir_ + "/optimizer_rank00001.safetensors");
  // shards of another model
  msg = read(table_of("gpt2-mini"), {{0, 1000}});
  EXPECT_NE(msg.find("optimizer_rank00000.safetensors was written for another parameter layout"), std::string::npos)
      << msg;
  // the trainer state claims more ranks than wrote shards
  st.world_size = 3;
  msg = read(table, all);
  EXPECT_NE(msg.find("optimizer_rank00002.safetensors"), std::string::npos) << msg;
  // fewer: the pieces of rank 1 are missing from the coverage
  st.world_size = 1;
  msg = read(table, all);
  EXPECT_NE(msg.find("do not cover parameter element"), std::string::npos) << msg;
  st.world_size = 2;

  // shards of two formats
  {
    const std::string mixed = path("mixed");
    fs::create_directories(mixed);
    write_state(mixed, table, full, 2, 1, StateFormat::bf16());
    const std::string bf16_rank1 = read_file(mixed + "/optimizer_rank00001.safetensors");
    write_state(mixed, table, full, 2, 1, fp32);
    std::ofstream(mixed + "/optimizer_rank00001.safetensors", std::ios::binary) << bf16_rank1;
    msg = error_of([&] { llmc::read_optimizer_moments(mixed, st, table, all, fp32, &note); });
    EXPECT_NE(msg.find("optimizer_rank00001.safetensors holds bf16 moments but"), std::string::npos) << msg;
    EXPECT_NE(msg.find("optimizer_rank00000.safetensors holds fp32"), std::string::npos) << msg;
  }
  // a format this build does not know, and tensors of another dtype than their format says, in either layout
  for (int stage : {1, 0}) {
    const std::string unknown = path("unknown" + std::to_string(stage)), lying = path("lying" + std::to_string(stage));
    fs::create_directories(unknown);
    fs::create_directories(lying);
    write_previous_build(unknown, table, full, 2, stage, {{llmc::kStateFormatKey, "fp8_coat"}});
    write_previous_build(lying, table, full, 2, stage, {{llmc::kStateFormatKey, "bf16"}});
    const std::string file = stage == 1 ? "optimizer_rank00000.safetensors" : "optimizer_m.safetensors";
    msg = error_of([&] { llmc::read_optimizer_moments(unknown, st, table, all, fp32, &note); });
    EXPECT_NE(msg.find(file + ": metadata 'state_format' = 'fp8_coat' is not a state format this build reads"),
              std::string::npos)
        << msg;
    msg = error_of([&] { llmc::read_optimizer_moments(lying, st, table, all, fp32, &note); });
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find("is F32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("BF16"), std::string::npos) << msg;
  }
}
