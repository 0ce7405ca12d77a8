// test/io/test_checkpoint: CRC-32C vectors, atomic checkpoint writes, verification, find-latest and retention, the
// leftovers of interrupted writes (*.tmp, no DONE, *.old), corruption (flipped byte, truncation, deleted file, bad
// JSON) refused with a message naming the file and the previous checkpoint only once that one verifies, resume
// resolution, and lineage: run id and parent recorded (checkpoints without them still load), a rollback moves the
// abandoned line aside so that resume "auto" continues the rollback line, a new run in a directory holding
// checkpoints stops unless checkpoint.overwrite (then they are moved aside, not deleted), retention never removes the
// resumed checkpoint nor a verified checkpoint in favour of one that does not verify; and hostile trainer_state.json
// files (duplicate keys, deep nesting, numbers past their fields' types, a file past the size bound) and FIFOs in a
// checkpoint, within time and memory bounds.
#include <gtest/gtest.h>

#include "test/support/bounded_run.h"
#include "test/support/temp_dir.h"

#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "llmc/io/checkpoint.h"
#include "llmc/core/common.h"
#include "llmc/io/safetensors.h"
#include "test/support/error_of.h"

namespace fs = std::filesystem;
using llmc_test::thrown_error;
using nlohmann::json;

namespace {

class CheckpointTest : public llmc_test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    run_ = path("run");  // the run directory itself does not exist yet
  }

  // A checkpoint like the trainer's: model.safetensors (weights filled with `fill`), two optimizer shards, a JSON file.
  std::string write_checkpoint(int64_t step, int keep = 0, float fill = 1.0f, llmc::RunLineage* lineage = nullptr,
                               std::vector<std::string>* notes = nullptr) {
    llmc::CheckpointWriter w(run_, step);
    std::vector<float> weights(1000, fill);
    llmc::SafetensorsWriter model;
    model.add("wte.weight", "F32", {10, 100}, weights.data(), weights.size() * 4);
    model.set_metadata("step", std::to_string(step));
    model.write(w.file_path("model.safetensors"));
    for (int rank = 0; rank < 2; rank++) {
      llmc::SafetensorsWriter opt;
      std::vector<float> m(500, float(rank)), v(500, 0.5f);
      opt.add("wte.weight.m", "F32", {500}, m.data(), 2000);
      opt.add("wte.weight.v", "F32", {500}, v.data(), 2000);
      opt.write(w.file_path(llmc::strformat("optimizer_rank%05d.safetensors", rank)));
    }
    w.add_json("precision_state.json", json{{"amax", {1.0, 2.0}}});
    w.add_bytes("notes.bin", "abc", 3);
    llmc::TrainerState st;
    st.step = step;
    st.world_size = 2;
    st.rng = {{"seed", 42}, {"offset", step * 7}};
    st.data = {{"rank0", {{"shard", 1}, {"pos", 4096}}}};
    st.config = {{"train", {{"lr", 6e-4}}}};
    st.extra = {{"tokens_seen", step * 1000}};
    return w.commit(st, keep, lineage, notes);
  }

  // Flips one byte of a checkpoint's model.safetensors: the checkpoint no longer verifies.
  void corrupt(int64_t step) {
    std::fstream f(step_path(step) + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(2000);
    char c;
    f.get(c);
    f.seekp(2000);
    f.put(char(c ^ 0x10));
  }

  // The subdirectories of <run>/abandoned/ (one per set-aside event).
  std::vector<std::string> abandoned_dirs() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run_ + "/abandoned", ec)) out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::vector<int64_t> steps() const {
    std::vector<int64_t> out;
    for (const auto& c : llmc::list_checkpoints(run_)) out.push_back(c.step);
    return out;
  }

  std::string step_path(int64_t step) const { return llmc::step_dir_path(run_, step); }

  std::string run_;
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(llmc::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(llmc::crc32c_portable("123456789", 9), 0xE3069283u);
  EXPECT_EQ(llmc::crc32c("", 0), 0u);
  // RFC 3720 (iSCSI) appendix B.4 vectors.
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), ascending(32);
  for (int i = 0; i < 32; i++) ascending[i] = uint8_t(i);
  EXPECT_EQ(llmc::crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(llmc::crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(llmc::crc32c(ascending.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(llmc::crc32c_hex(0xE3069283u), "e3069283");
  EXPECT_EQ(llmc::crc32c_hex(0x1u), "00000001");
}

TEST(Crc32c, FastPathMatchesTablesAndContinues) {
  std::mt19937 rng(123);
  std::vector<uint8_t> buf(10000);
  for (auto& b : buf) b = uint8_t(rng());
  for (size_t offset : {0, 1, 3, 7}) {
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 1000, 9993}) {
      const uint8_t* p = buf.data() + offset;
      uint32_t whole = llmc::crc32c_portable(p, len);
      EXPECT_EQ(llmc::crc32c(p, len), whole) << offset << " " << len;
      size_t half = len / 3;
      EXPECT_EQ(llmc::crc32c(p + half, len - half, llmc::crc32c(p, half)), whole);
    }
  }
}

TEST(CheckpointNames, StepDirs) {
  EXPECT_EQ(llmc::step_dir_name(300), "step_00000300");
  EXPECT_EQ(llmc::step_dir_name(123456789), "step_123456789");
  EXPECT_EQ(llmc::step_dir_path("runs/x", 5), "runs/x/step_00000005");
  EXPECT_EQ(llmc::checkpoint_tmp_path("runs/x", 5), "runs/x/step_00000005.tmp");
  EXPECT_EQ(llmc::parse_step_dir_name("step_00000300"), 300);
  EXPECT_EQ(llmc::parse_step_dir_name("step_123456789"), 123456789);
  EXPECT_FALSE(llmc::parse_step_dir_name("step_300"));
  EXPECT_FALSE(llmc::parse_step_dir_name("step_00000300.tmp"));
  EXPECT_FALSE(llmc::parse_step_dir_name("step_0000030a"));
  EXPECT_FALSE(llmc::parse_step_dir_name("metrics.jsonl"));
  EXPECT_THROW(llmc::step_dir_name(-1), llmc::Error);
}

TEST_F(CheckpointTest, WriteVerifyLoad) {
  const std::string dir = write_checkpoint(300);
  EXPECT_EQ(dir, step_path(300));
  EXPECT_TRUE(fs::exists(dir + "/DONE"));
  EXPECT_TRUE(fs::exists(dir + "/trainer_state.json"));
  EXPECT_FALSE(fs::exists(dir + ".tmp"));

  llmc::TrainerState st = llmc::verify_checkpoint(dir);
  EXPECT_EQ(st.format_version, llmc::kCheckpointFormatVersion);
  EXPECT_EQ(st.step, 300);
  EXPECT_EQ(st.world_size, 2);
  EXPECT_EQ(st.rng["offset"], 2100);
  EXPECT_EQ(st.data["rank0"]["pos"], 4096);
  EXPECT_EQ(st.config["train"]["lr"], 6e-4);
  EXPECT_EQ(st.extra["tokens_seen"], 300000);
  EXPECT_EQ(st.raw["checksum"], "crc32c");
  std::vector<std::string> names;
  for (const auto& f : st.files) {
    names.push_back(f.name);
    EXPECT_EQ(f.bytes, fs::file_size(dir + "/" + f.name)) << f.name;
    EXPECT_EQ(f.crc32c, llmc::crc32c_file(dir + "/" + f.name)) << f.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"model.safetensors", "notes.bin", "optimizer_rank00000.safetensors",
                                             "optimizer_rank00001.safetensors", "precision_state.json"}));
  // The weights load back.
  llmc::SafetensorsReader model(dir + "/model.safetensors");
  EXPECT_EQ(model.read_as_float("wte.weight"), std::vector<float>(1000, 1.0f));
  EXPECT_EQ(model.metadata().at("step"), "300");
  EXPECT_EQ(llmc::load_trainer_state(dir).step, 300);
}

TEST_F(CheckpointTest, WriterRejectsBadUse) {
  llmc::CheckpointWriter w(run_, 10);
  EXPECT_THROW(w.file_path("a/b"), llmc::Error);
  EXPECT_THROW(w.file_path("DONE"), llmc::Error);
  EXPECT_THROW(w.file_path("trainer_state.json"), llmc::Error);
  EXPECT_THROW(w.file_path(""), llmc::Error);
  llmc::TrainerState st;
  st.step = 11;
  EXPECT_THROW(w.commit(st, 0), llmc::Error);  // step differs from the writer's
  EXPECT_THROW(llmc::CheckpointWriter("", 1), llmc::Error);
}

TEST_F(CheckpointTest, AbandonedWriterLeavesNothing) {
  {
    llmc::CheckpointWriter w(run_, 50);
    w.add_bytes("model.safetensors", "partial", 7);
    EXPECT_TRUE(fs::exists(llmc::checkpoint_tmp_path(run_, 50)));
  }  // destroyed without commit (as after an exception)
  EXPECT_FALSE(fs::exists(llmc::checkpoint_tmp_path(run_, 50)));
  EXPECT_FALSE(llmc::find_latest_checkpoint(run_));
}

TEST_F(CheckpointTest, LatestSkipsIncompleteAndTmp) {
  write_checkpoint(100);
  write_checkpoint(200);
  // A crash while writing 300 (tmp left) and one between rename and DONE for 400.
  fs::create_directories(llmc::checkpoint_tmp_path(run_, 300));
  std::ofstream(llmc::checkpoint_tmp_path(run_, 300) + "/model.safetensors") << "partial";
  fs::create_directories(step_path(400));
  std::ofstream(step_path(400) + "/trainer_state.json") << "{}";
  std::vector<std::string> notes;
  auto latest = llmc::find_latest_checkpoint(run_, &notes);
  ASSERT_TRUE(latest);
  EXPECT_EQ(*latest, step_path(200));
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_TRUE(contains(notes[0], "step_00000400") && contains(notes[0], "no DONE")) << notes[0];
  EXPECT_TRUE(contains(notes[1], "step_00000300.tmp")) << notes[1];
  auto info = llmc::list_checkpoints(run_);
  ASSERT_EQ(info.size(), 3u);
  EXPECT_TRUE(info[0].complete && info[1].complete && !info[2].complete);
  EXPECT_EQ(info[2].step, 400);

  // The next successful write cleans up the leftovers.
  write_checkpoint(250);
  EXPECT_FALSE(fs::exists(llmc::checkpoint_tmp_path(run_, 300)));
  EXPECT_FALSE(fs::exists(step_path(400)));
  EXPECT_EQ(*llmc::find_latest_checkpoint(run_), step_path(250));
  EXPECT_FALSE(llmc::find_latest_checkpoint(run_ + "/missing"));
  EXPECT_FALSE(llmc::find_latest_checkpoint(""));
}

TEST_F(CheckpointTest, RetentionKeepsNewestComplete) {
  for (int64_t step : {100, 200, 300, 400}) write_checkpoint(step, /*keep=*/2);
  auto info = llmc::list_checkpoints(run_);
  ASSERT_EQ(info.size(), 2u);
  EXPECT_EQ(info[0].step, 300);
  EXPECT_EQ(info[1].step, 400);
  write_checkpoint(500, /*keep=*/0);  // 0 keeps all
  EXPECT_EQ(llmc::list_checkpoints(run_).size(), 3u);
  write_checkpoint(600, /*keep=*/1);
  info = llmc::list_checkpoints(run_);
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].step, 600);
  // The checkpoint just written is kept even when newer ones exist (resumed from an older step).
  write_checkpoint(700, 0);
  write_checkpoint(650, /*keep=*/1);
  info = llmc::list_checkpoints(run_);
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].step, 650);
}

TEST_F(CheckpointTest, SameStepIsReplacedSafely) {
  write_checkpoint(100, 0, 1.0f);
  write_checkpoint(100, 0, 2.0f);
  EXPECT_FALSE(fs::exists(step_path(100) + ".old"));
  llmc::verify_checkpoint(step_path(100));
  llmc::SafetensorsReader model(step_path(100) + "/model.safetensors");
  EXPECT_EQ(model.read_as_float("wte.weight")[0], 2.0f);

  // A crash after moving the old one aside and renaming the new one, before DONE: the .old one is used.
  fs::rename(step_path(100), step_path(100) + ".old");
  fs::create_directories(step_path(100));
  std::vector<std::string> notes;
  auto latest = llmc::find_latest_checkpoint(run_, &notes);
  ASSERT_TRUE(latest);
  EXPECT_EQ(*latest, step_path(100) + ".old");
  ASSERT_FALSE(notes.empty());
  EXPECT_TRUE(contains(notes[0], ".old")) << notes[0];
  EXPECT_EQ(llmc::verify_checkpoint(*latest).step, 100);
}

TEST_F(CheckpointTest, CorruptionIsRefusedAndPreviousStillVerifies) {
  write_checkpoint(200);
  const std::string good = step_path(200);
  const std::string model = step_path(300) + "/model.safetensors";

  // Flipped byte.
  write_checkpoint(300);
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(2000);
    char c;
    f.get(c);
    f.seekp(2000);
    f.put(char(c ^ 0x10));
  }
  std::string msg = thrown_error([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, "checkpoint file " + model + " is corrupt (checksum mismatch)")) << msg;
  EXPECT_TRUE(contains(msg, "the previous checkpoint " + good + " is still usable")) << msg;
  EXPECT_TRUE(contains(msg, "checkpoint.resume")) << msg;
  EXPECT_EQ(llmc::verify_checkpoint(good).step, 200);
  // auto resume refuses the corrupt newest checkpoint with the same message.
  msg = thrown_error([&] { llmc::resolve_resume("auto", run_); });
  EXPECT_TRUE(contains(msg, model) && contains(msg, good)) << msg;

  // Truncated file.
  write_checkpoint(300);
  fs::resize_file(model, fs::file_size(model) - 10);
  msg = thrown_error([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, model) && contains(msg, "truncated")) << msg;
  EXPECT_EQ(llmc::verify_checkpoint(good).step, 200);

  // Deleted file.
  write_checkpoint(300);
  const std::string shard = step_path(300) + "/optimizer_rank00001.safetensors";
  fs::remove(shard);
  msg = thrown_error([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, "checkpoint file " + shard + " is missing")) << msg;
  EXPECT_TRUE(contains(msg, good)) << msg;

  // trainer_state.json edited or broken: its CRC no longer matches DONE.
  write_checkpoint(300);
  const std::string state = step_path(300) + "/trainer_state.json";
  std::ofstream(state, std::ios::app) << "{";
  msg = thrown_error([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, state) && contains(msg, "corrupt")) << msg;
  msg = thrown_error([&] { llmc::load_trainer_state(step_path(300)); });
  EXPECT_TRUE(contains(msg, state) && contains(msg, "corrupt") && contains(msg, "invalid JSON")) << msg;

  // Missing DONE: incomplete.
  write_checkpoint(300);
  fs::remove(step_path(300) + "/DONE");
  msg = thrown_error([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, "incomplete") && contains(msg, good)) << msg;
  EXPECT_EQ(llmc::verify_checkpoint(good).step, 200);
}

TEST_F(CheckpointTest, CorruptOnlyCheckpointSaysStartOver) {
  write_checkpoint(100);
  fs::resize_file(step_path(100) + "/notes.bin", 1);
  std::string msg = thrown_error([&] { llmc::verify_checkpoint(step_path(100)); });
  EXPECT_TRUE(contains(msg, "notes.bin") && contains(msg, "no earlier checkpoint in " + run_ + " verifies")) << msg;
}

TEST_F(CheckpointTest, TrainerStateValidation) {
  fs::create_directories(run_ + "/manual");
  const std::string state = run_ + "/manual/trainer_state.json";
  auto write_state = [&](const json& j) { std::ofstream(state) << j.dump(); };
  json ok = {{"format_version", 1}, {"step", 5}, {"world_size", 1}, {"files", json::array()}};
  write_state(ok);
  EXPECT_EQ(llmc::load_trainer_state(run_ + "/manual").step, 5);
  json bad = ok;
  bad["format_version"] = 99;
  write_state(bad);
  EXPECT_TRUE(contains(thrown_error([&] { llmc::load_trainer_state(run_ + "/manual"); }), "format_version 99"));
  bad = ok;
  bad.erase("world_size");
  write_state(bad);
  EXPECT_TRUE(contains(thrown_error([&] { llmc::load_trainer_state(run_ + "/manual"); }), "'world_size'"));
  bad = ok;
  bad["files"] = {{{"name", "x"}, {"bytes", 3}}};
  write_state(bad);
  EXPECT_TRUE(contains(thrown_error([&] { llmc::load_trainer_state(run_ + "/manual"); }), "crc32c"));
  EXPECT_TRUE(contains(thrown_error([&] { llmc::load_trainer_state(run_ + "/nothing"); }), "missing"));
}

TEST_F(CheckpointTest, ResolveResume) {
  EXPECT_FALSE(llmc::resolve_resume("none", run_));
  EXPECT_FALSE(llmc::resolve_resume("auto", ""));
  EXPECT_FALSE(llmc::resolve_resume("auto", run_));  // missing run dir
  fs::create_directories(run_);
  EXPECT_FALSE(llmc::resolve_resume("auto", run_));  // empty run dir
  EXPECT_THROW(llmc::resolve_resume("", run_), llmc::Error);

  write_checkpoint(100);
  write_checkpoint(200);
  EXPECT_EQ(*llmc::resolve_resume("auto", run_), step_path(200));
  EXPECT_EQ(*llmc::resolve_resume(step_path(100), run_), step_path(100));  // explicit older step

  std::string msg = thrown_error([&] { llmc::resolve_resume(step_path(900), run_); });
  EXPECT_TRUE(contains(msg, step_path(900)) && contains(msg, "does not exist")) << msg;
  msg = thrown_error([&] { llmc::resolve_resume(run_, run_); });
  EXPECT_TRUE(contains(msg, "run directory")) << msg;
  fs::remove(step_path(200) + "/DONE");
  msg = thrown_error([&] { llmc::resolve_resume(step_path(200), run_); });
  EXPECT_TRUE(contains(msg, "incomplete") && contains(msg, step_path(100))) << msg;
  // auto skips the incomplete one.
  std::vector<std::string> notes;
  EXPECT_EQ(*llmc::resolve_resume("auto", run_, &notes), step_path(100));
  EXPECT_EQ(notes.size(), 1u);
}

TEST_F(CheckpointTest, WorldSizeMismatch) {
  write_checkpoint(100);
  llmc::TrainerState st = llmc::load_trainer_state(step_path(100));
  EXPECT_NO_THROW(llmc::check_world_size(st, 2, step_path(100)));
  std::string msg = thrown_error([&] { llmc::check_world_size(st, 4, step_path(100)); });
  EXPECT_EQ(msg, llmc::world_size_mismatch_message(step_path(100), 2, 4));
  EXPECT_TRUE(contains(msg, "2 rank(s)") && contains(msg, "has 4") && contains(msg, "train.init_from")) << msg;
}

// ------------------------------------------------------------------------------------------------------------------
// The "previous checkpoint is still usable" hint

TEST_F(CheckpointTest, PreviousCheckpointHintIsVerifiedNotGuessed) {
  write_checkpoint(100);
  write_checkpoint(200);
  write_checkpoint(300);
  corrupt(300);
  corrupt(200);  // the same size as a good one: a size check would call it usable
  std::string msg = thrown_error([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, "the previous checkpoint " + step_path(100) + " is still usable")) << msg;
  EXPECT_FALSE(contains(msg, step_path(200))) << msg;
  corrupt(100);
  msg = thrown_error([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, "no earlier checkpoint in " + run_ + " verifies")) << msg;
  EXPECT_FALSE(contains(msg, "still usable")) << msg;
  // The same for an incomplete checkpoint given to resume.
  write_checkpoint(50);
  fs::remove(step_path(300) + "/DONE");
  msg = thrown_error([&] { llmc::resolve_resume(step_path(300), run_); });
  EXPECT_TRUE(contains(msg, "incomplete") && contains(msg, "the previous checkpoint " + step_path(50))) << msg;
}

// ------------------------------------------------------------------------------------------------------------------
// Lineage: run id and parent

TEST_F(CheckpointTest, LineageIsRecordedAndOlderCheckpointsStillLoad) {
  const std::string id = llmc::new_run_id();
  EXPECT_EQ(id.size(), std::string("20250611T142233Z-3f9a1c2b").size()) << id;
  EXPECT_NE(id, llmc::new_run_id());  // 32 random bits

  llmc::RunStart start = llmc::start_run("auto", run_, false);  // nothing to resume: a fresh run
  EXPECT_FALSE(start.resume_dir);
  const std::string run_id = start.lineage.run_id;
  EXPECT_FALSE(run_id.empty());
  write_checkpoint(100, 0, 1.0f, &start.lineage);
  write_checkpoint(200, 0, 1.0f, &start.lineage);
  llmc::TrainerState s100 = llmc::verify_checkpoint(step_path(100)), s200 = llmc::verify_checkpoint(step_path(200));
  EXPECT_EQ(s100.run_id, run_id);
  EXPECT_EQ(s100.parent, "");
  EXPECT_TRUE(s100.raw["parent"].is_null());
  EXPECT_EQ(s200.run_id, run_id);
  EXPECT_EQ(s200.parent, step_path(100));

  // Resuming keeps the run id; the next checkpoint's parent is the resumed one.
  llmc::RunStart resumed = llmc::start_run("auto", run_, false);
  ASSERT_TRUE(resumed.resume_dir);
  EXPECT_EQ(*resumed.resume_dir, step_path(200));
  EXPECT_EQ(resumed.lineage.run_id, run_id);
  EXPECT_EQ(resumed.lineage.resumed_from, step_path(200));
  write_checkpoint(300, 0, 1.0f, &resumed.lineage);
  EXPECT_EQ(llmc::load_trainer_state(step_path(300)).parent, step_path(200));

  // A checkpoint written before lineage was recorded (no run_id / parent keys) verifies, resumes, and the run gets a
  // new id.
  const std::string state_path = step_path(300) + "/trainer_state.json";
  json j = json::parse(std::ifstream(state_path));
  j.erase("run_id");
  j.erase("parent");
  const std::string text = j.dump(2) + "\n";
  std::ofstream(state_path, std::ios::trunc) << text;
  std::ofstream(step_path(300) + "/DONE", std::ios::trunc)
      << "trainer_state.json crc32c " << llmc::crc32c_hex(llmc::crc32c(text.data(), text.size())) << "\n";
  llmc::TrainerState old = llmc::verify_checkpoint(step_path(300));
  EXPECT_EQ(old.run_id, "");
  EXPECT_EQ(old.parent, "");
  llmc::RunStart from_old = llmc::start_run("auto", run_, false);
  ASSERT_TRUE(from_old.resume_dir);
  EXPECT_EQ(*from_old.resume_dir, step_path(300));
  EXPECT_FALSE(from_old.lineage.run_id.empty());
  EXPECT_NE(from_old.lineage.run_id, run_id);
  ASSERT_EQ(from_old.notes.size(), 1u);
  EXPECT_TRUE(contains(from_old.notes[0], "records no run id")) << from_old.notes[0];

  // Lineage fields of the wrong type are corruption, named.
  j["run_id"] = 7;
  std::ofstream(state_path, std::ios::trunc) << j.dump();
  EXPECT_TRUE(contains(thrown_error([&] { llmc::load_trainer_state(step_path(300)); }), "'run_id'"));
}

// ------------------------------------------------------------------------------------------------------------------
// Rollback

TEST_F(CheckpointTest, RollbackMovesTheAbandonedLineAsideAndAutoContinuesTheRollbackLine) {
  llmc::RunLineage first = llmc::start_run("auto", run_, false).lineage;
  for (int64_t step : {100, 200, 300, 400}) write_checkpoint(step, /*keep=*/0, 1.0f, &first);

  // Resume from step 200: 300 and 400 belong to the line the rollback abandons.
  llmc::RunStart rollback = llmc::start_run(step_path(200), run_, false);
  ASSERT_TRUE(rollback.resume_dir);
  EXPECT_EQ(*rollback.resume_dir, step_path(200));
  EXPECT_EQ(rollback.lineage.run_id, first.run_id);  // the same run, continued from an older point
  EXPECT_EQ(steps(), (std::vector<int64_t>{100, 200}));
  const std::vector<std::string> aside = abandoned_dirs();
  ASSERT_EQ(aside.size(), 1u);
  for (int64_t step : {300, 400})  // moved whole: still verifiable where they are now, never deleted
    EXPECT_EQ(llmc::verify_checkpoint(aside[0] + "/" + llmc::step_dir_name(step)).step, step);
  const json note = json::parse(std::ifstream(aside[0] + "/set_aside.json"));
  EXPECT_EQ(note["reason"], "rollback");
  EXPECT_EQ(note["run_id"], first.run_id);
  EXPECT_EQ(note["resumed_from"], step_path(200));
  EXPECT_EQ(note["moved"], (json{"step_00000300", "step_00000400"}));
  ASSERT_EQ(rollback.notes.size(), 1u);
  EXPECT_TRUE(contains(rollback.notes[0], "rollback") && contains(rollback.notes[0], "step_00000300, step_00000400") &&
              contains(rollback.notes[0], aside[0]))
      << rollback.notes[0];

  // A crash before the rollback line's first checkpoint: auto takes the rollback point, not the abandoned line.
  EXPECT_EQ(*llmc::resolve_resume("auto", run_), step_path(200));
  // The rollback line writes step 300 again; with keep = 1 retention still keeps the checkpoint it resumed from.
  write_checkpoint(300, /*keep=*/1, 2.0f, &rollback.lineage);
  EXPECT_EQ(steps(), (std::vector<int64_t>{200, 300}));
  EXPECT_EQ(llmc::load_trainer_state(step_path(300)).parent, step_path(200));
  write_checkpoint(350, /*keep=*/1, 2.0f, &rollback.lineage);
  EXPECT_EQ(steps(), (std::vector<int64_t>{200, 350}));
  // The next start continues the rollback line.
  llmc::RunStart next = llmc::start_run("auto", run_, false);
  EXPECT_EQ(*next.resume_dir, step_path(350));
  EXPECT_TRUE(next.notes.empty());
  EXPECT_EQ(abandoned_dirs().size(), 1u);
  llmc::SafetensorsReader model(step_path(350) + "/model.safetensors");
  EXPECT_EQ(model.read_as_float("wte.weight")[0], 2.0f);

  // A second rollback gets its own directory next to the first.
  llmc::start_run(step_path(200), run_, false);
  EXPECT_EQ(abandoned_dirs().size(), 2u);
  EXPECT_EQ(steps(), (std::vector<int64_t>{200}));
}

TEST_F(CheckpointTest, RollbackAlsoMovesACompleteOldFallback) {
  write_checkpoint(100);
  write_checkpoint(300);
  // A crash while step 300 was being replaced: step_300.old is complete, step_300 is not.
  fs::rename(step_path(300), step_path(300) + ".old");
  fs::create_directories(step_path(300));
  ASSERT_EQ(*llmc::find_latest_checkpoint(run_), step_path(300) + ".old");
  llmc::start_run(step_path(100), run_, false);
  EXPECT_EQ(*llmc::find_latest_checkpoint(run_), step_path(100));  // auto no longer picks the abandoned line
  ASSERT_EQ(abandoned_dirs().size(), 1u);
  EXPECT_TRUE(fs::exists(abandoned_dirs()[0] + "/step_00000300.old/DONE"));
}

// ------------------------------------------------------------------------------------------------------------------
// A new run in a directory that holds checkpoints

TEST_F(CheckpointTest, ResumeNoneInADirectoryWithCheckpointsStopsUnlessOverwrite) {
  write_checkpoint(100);
  write_checkpoint(200);
  std::string msg = thrown_error([&] { llmc::start_run("none", run_, false); });
  for (const std::string& part : {"checkpoint.dir " + run_, std::string("2 checkpoint(s)"), step_path(200),
                                  std::string("checkpoint.resume = \"none\""), std::string("checkpoint.overwrite=true"),
                                  std::string("checkpoint.resume=auto")})
    EXPECT_TRUE(contains(msg, part)) << part << " not in: " << msg;
  EXPECT_EQ(steps(), (std::vector<int64_t>{100, 200}));  // nothing touched
  EXPECT_TRUE(abandoned_dirs().empty());

  llmc::RunStart fresh = llmc::start_run("none", run_, /*overwrite=*/true);
  EXPECT_FALSE(fresh.resume_dir);
  EXPECT_TRUE(steps().empty());
  EXPECT_FALSE(llmc::find_latest_checkpoint(run_));
  ASSERT_EQ(abandoned_dirs().size(), 1u);
  EXPECT_EQ(llmc::verify_checkpoint(abandoned_dirs()[0] + "/step_00000200").step, 200);  // kept
  EXPECT_EQ(json::parse(std::ifstream(abandoned_dirs()[0] + "/set_aside.json"))["reason"], "overwrite");
  ASSERT_EQ(fresh.notes.size(), 1u);
  EXPECT_TRUE(contains(fresh.notes[0], "checkpoint.overwrite") && contains(fresh.notes[0], fresh.lineage.run_id))
      << fresh.notes[0];
  // The new run writes its own checkpoints; retention never reaches the ones set aside.
  write_checkpoint(10, /*keep=*/1, 1.0f, &fresh.lineage);
  write_checkpoint(20, /*keep=*/1, 1.0f, &fresh.lineage);
  EXPECT_EQ(steps(), (std::vector<int64_t>{20}));
  EXPECT_TRUE(fs::exists(abandoned_dirs()[0] + "/step_00000100/DONE"));

  // Only incomplete leftovers (no DONE) are not checkpoints: resume none starts without complaint.
  fs::remove_all(run_);
  fs::create_directories(step_path(5));
  EXPECT_NO_THROW(llmc::start_run("none", run_, false));
}

TEST_F(CheckpointTest, ResumeFromAnotherDirectoryIntoOneWithCheckpointsStopsUnlessOverwrite) {
  const std::string other_run = run_;
  write_checkpoint(500);
  run_ = path("second");
  write_checkpoint(100);
  const std::string foreign = llmc::step_dir_path(other_run, 500);
  std::string msg = thrown_error([&] { llmc::start_run(foreign, run_, false); });
  EXPECT_TRUE(contains(msg, "continues a checkpoint of another directory") && contains(msg, "checkpoint.overwrite"))
      << msg;
  llmc::RunStart start = llmc::start_run(foreign, run_, true);
  EXPECT_EQ(*start.resume_dir, foreign);
  EXPECT_TRUE(steps().empty());
  EXPECT_EQ(abandoned_dirs().size(), 1u);
  // The same directory named another way is not "another directory".
  write_checkpoint(200);
  write_checkpoint(300);
  EXPECT_NO_THROW(llmc::start_run(run_ + "/./" + llmc::step_dir_name(300), run_ + "/", false));
}

TEST(CheckpointLineage, LeftBehindDecisions) {
  const std::vector<llmc::CheckpointInfo> complete = {
      {100, "r/step_00000100", true}, {200, "r/step_00000200", true}, {300, "r/step_00000300.old", true}};
  auto steps_of = [](const std::vector<llmc::CheckpointInfo>& v) {
    std::vector<int64_t> out;
    for (const auto& c : v) out.push_back(c.step);
    return out;
  };
  // Resumed in the run dir: the newer ones (a rollback); the newest: none.
  EXPECT_EQ(steps_of(llmc::checkpoints_left_behind(complete, 100, true, false, "r", "r/step_00000100")),
            (std::vector<int64_t>{200, 300}));
  EXPECT_TRUE(llmc::checkpoints_left_behind(complete, 300, true, false, "r", "auto").empty());
  // Fresh start or a foreign checkpoint: all, only with overwrite.
  EXPECT_EQ(steps_of(llmc::checkpoints_left_behind(complete, std::nullopt, false, true, "r", "none")),
            (std::vector<int64_t>{100, 200, 300}));
  EXPECT_EQ(steps_of(llmc::checkpoints_left_behind(complete, 500, false, true, "r", "x/step_00000500")),
            (std::vector<int64_t>{100, 200, 300}));
  EXPECT_THROW(llmc::checkpoints_left_behind(complete, std::nullopt, false, false, "r", "none"), llmc::Error);
  EXPECT_THROW(llmc::checkpoints_left_behind(complete, 500, false, false, "r", "x/step_00000500"), llmc::Error);
  EXPECT_TRUE(llmc::checkpoints_left_behind({}, std::nullopt, false, false, "r", "none").empty());
}

// ------------------------------------------------------------------------------------------------------------------
// Retention

TEST(CheckpointRetention, CountsOnlyVerifiedCheckpointsNewestFirst) {
  // 100 good, 200 corrupt, 300 good, 400 just written, 450 without DONE.
  const std::vector<llmc::CheckpointInfo> listing = {{100, "r/100", true},
                                                     {200, "r/200", true},
                                                     {300, "r/300", true},
                                                     {400, "r/400", true},
                                                     {450, "r/450", false}};
  std::vector<std::string> asked;
  auto verifies = [&](const std::string& path) {
    asked.push_back(path);
    return path != "r/200";
  };
  // keep 2: 400 and 300 are kept; the rest go, without being read.
  EXPECT_EQ(llmc::retention_removals(listing, 400, 2, "", verifies),
            (std::vector<std::string>{"r/450", "r/200", "r/100"}));
  EXPECT_EQ(asked, (std::vector<std::string>{"r/300"}));
  // keep 3: 200 does not verify, so it does not count and the verified 100 is kept as the third.
  asked.clear();
  EXPECT_EQ(llmc::retention_removals(listing, 400, 3, "", verifies), (std::vector<std::string>{"r/450"}));
  EXPECT_EQ(asked, (std::vector<std::string>{"r/300", "r/200", "r/100"}));
  // keep 1: only the current one counts, but the checkpoint the run resumed from stays.
  EXPECT_EQ(llmc::retention_removals(listing, 400, 1, "r/100", verifies),
            (std::vector<std::string>{"r/450", "r/300", "r/200"}));
  // keep 0: every complete checkpoint stays.
  EXPECT_EQ(llmc::retention_removals(listing, 400, 0, "", verifies), (std::vector<std::string>{"r/450"}));
}

TEST_F(CheckpointTest, RetentionKeepsAVerifiedOlderCheckpointOverACorruptNewerOne) {
  write_checkpoint(100);
  write_checkpoint(200);
  corrupt(200);
  std::vector<std::string> notes;
  write_checkpoint(300, /*keep=*/2, 1.0f, nullptr, &notes);
  EXPECT_EQ(steps(), (std::vector<int64_t>{100, 200, 300}));  // 300 and the verified 100; 200 is not counted
  EXPECT_EQ(llmc::verify_checkpoint(step_path(100)).step, 100);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(contains(notes[0], step_path(200)) && contains(notes[0], "does not verify") &&
              contains(notes[0], "checksum mismatch"))
      << notes[0];
  // Once two newer checkpoints verify, both older ones go.
  write_checkpoint(400, /*keep=*/2);
  EXPECT_EQ(steps(), (std::vector<int64_t>{300, 400}));
}

TEST_F(CheckpointTest, RetentionVerifiesEachCheckpointOncePerLineage) {
  llmc::RunLineage lineage = llmc::start_run("auto", run_, false).lineage;
  write_checkpoint(100, 0, 1.0f, &lineage);
  write_checkpoint(200, 0, 1.0f, &lineage);
  // What this process wrote is known to verify; damage behind its back is not re-read (that is what resume checks).
  corrupt(100);
  std::vector<std::string> notes;
  write_checkpoint(300, /*keep=*/3, 1.0f, &lineage, &notes);
  EXPECT_TRUE(notes.empty());
  EXPECT_EQ(lineage.parent, step_path(300));
  // A lineage that did not write or resume it verifies it, once.
  llmc::RunLineage other;
  other.run_id = "x";
  write_checkpoint(400, /*keep=*/4, 1.0f, &other, &notes);
  EXPECT_EQ(notes.size(), 1u);
  write_checkpoint(500, /*keep=*/5, 1.0f, &other, &notes);
  EXPECT_EQ(notes.size(), 1u);  // remembered
  EXPECT_EQ(steps(), (std::vector<int64_t>{100, 200, 300, 400, 500}));
}

TEST_F(CheckpointTest, RetentionNeverRemovesTheResumedCheckpointEvenAnOldFallback) {
  write_checkpoint(100);
  write_checkpoint(200);
  fs::rename(step_path(200), step_path(200) + ".old");  // the only copy of step 200
  llmc::RunStart start = llmc::start_run("auto", run_, false);
  ASSERT_EQ(*start.resume_dir, step_path(200) + ".old");
  write_checkpoint(300, /*keep=*/1, 1.0f, &start.lineage);
  EXPECT_TRUE(fs::exists(step_path(200) + ".old/DONE"));
  EXPECT_EQ(steps(), (std::vector<int64_t>{300}));
}

TEST_F(CheckpointTest, HostileTrainerStateIsRefused) {
  fs::create_directories(run_ + "/manual");
  const std::string dir = run_ + "/manual", state = dir + "/trainer_state.json";
  auto error_for = [&](const std::string& text) {
    std::ofstream(state, std::ios::trunc) << text;
    return thrown_error([&] { llmc::load_trainer_state(dir); });
  };
  // A key twice (nlohmann kept the last silently), at the top and deeper.
  EXPECT_TRUE(contains(error_for("{\"format_version\": 1, \"step\": 5,\n\"step\": 7, \"world_size\": 1, \"files\": []}"),
                       "checkpoint file is corrupt: " + state + ": duplicate key 'step' (line 2)"));
  EXPECT_TRUE(contains(error_for(R"({"format_version": 1, "step": 5, "world_size": 1, "files": [],)"
                                 R"( "data": {"rank0": {"batch": 1, "batch": 2}}})"),
                       "duplicate key 'data.rank0.batch'"));
  // Deep nesting in an opaque field, within bounds (the fields are copied, which recurses).
  llmc_test::expect_bounded_error(
      [&] {
        std::ofstream(state, std::ios::trunc) << R"({"format_version": 1, "step": 5, "world_size": 1, "files": [], )"
                                              << "\"extra\": " << std::string(100000, '[') << "}";
        llmc::load_trainer_state(dir);
      },
      {state, "nested deeper than 64 levels"});
  // Numbers past their fields' types were truncated into valid-looking ones (format_version 2^32 + 1 read as 1,
  // world_size 2^32 + 1 as 1, step 2^63 as a negative step).
  EXPECT_TRUE(contains(error_for(R"({"format_version": 4294967297, "step": 5, "world_size": 1, "files": []})"),
                       "format_version 4294967297"));
  EXPECT_TRUE(contains(error_for(R"({"format_version": 1, "step": 5, "world_size": 4294967297, "files": []})"),
                       "'world_size' missing or not a positive integer of at most 1048576"));
  EXPECT_TRUE(contains(error_for(R"({"format_version": 1, "step": 9223372036854775808, "world_size": 1, "files": []})"),
                       "'step' missing or not a non-negative integer of at most 1000000000"));
  EXPECT_TRUE(contains(error_for(R"({"format_version": 1, "step": 1e999, "world_size": 1, "files": []})"),
                       "the number 1e999 of 'step' does not fit"));
  // A trainer_state.json past the size bound (sparse): refused before it is read.
  std::ofstream(state, std::ios::trunc) << "{}";
  fs::resize_file(state, 65ull << 20);
  llmc_test::expect_bounded_error([&] { llmc::load_trainer_state(dir); }, {state, "more than the 67108864 bytes"}, 2,
                                  64ull << 20);
}

TEST_F(CheckpointTest, FifosInACheckpointDoNotBlock) {
  // trainer_state.json as a FIFO: an error naming it, at once.
  fs::create_directories(run_ + "/fifo_state");
  llmc_test::make_fifo(run_ + "/fifo_state/trainer_state.json");
  llmc_test::expect_bounded_error([&] { llmc::load_trainer_state(run_ + "/fifo_state"); },
                                  {"checkpoint file '" + run_ + "/fifo_state/trainer_state.json' is a FIFO"}, 2);
  // DONE as a FIFO: named when it is read, and not a DONE marker for resume.
  write_checkpoint(100);
  const std::string done = step_path(100) + "/DONE";
  fs::remove(done);
  llmc_test::make_fifo(done);
  llmc_test::expect_bounded_error([&] { llmc::verify_checkpoint(step_path(100)); }, {"'" + done + "' is a FIFO"}, 2);
  llmc_test::expect_bounded_error([&] { llmc::resolve_resume(step_path(100), run_); }, {"incomplete"}, 2);
  // A listed file replaced by a FIFO: refused, never opened for reading.
  write_checkpoint(200);
  const std::string model = step_path(200) + "/model.safetensors";
  fs::remove(model);
  llmc_test::make_fifo(model);
  llmc_test::expect_bounded_error([&] { llmc::verify_checkpoint(step_path(200)); }, {model}, 2);
  llmc_test::expect_bounded_error([&] { llmc::crc32c_file(model); }, {"'" + model + "' is a FIFO"}, 2);
}
