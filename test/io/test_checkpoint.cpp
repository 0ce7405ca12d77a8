// test/io/test_checkpoint: CRC-32C vectors, atomic checkpoint writes, verification, find-latest and retention, the
// leftovers of interrupted writes (*.tmp, no DONE, *.old), corruption (flipped byte, truncation, deleted file, bad
// JSON) refused with a message naming the file while the previous checkpoint still verifies, resume resolution, and
// hostile trainer_state.json files (duplicate keys, deep nesting, numbers past their fields' types, a file past the
// size bound) and FIFOs in a checkpoint, within time and memory bounds.
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

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class CheckpointTest : public llmc_test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    run_ = path("run");  // the run directory itself does not exist yet
  }

  // A checkpoint like the trainer's: model.safetensors (weights filled with `fill`), two optimizer shards, a JSON file.
  std::string write_checkpoint(int64_t step, int keep = 0, float fill = 1.0f) {
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
    return w.commit(st, keep);
  }

  std::string step_path(int64_t step) const { return llmc::step_dir_path(run_, step); }

  // The message of the llmc::Error thrown by f (fails the test when nothing is thrown).
  template <class F>
  std::string error_of(F f) {
    try {
      f();
    } catch (const llmc::Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no llmc::Error thrown";
    return "";
  }

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
  std::string msg = error_of([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, "checkpoint file " + model + " is corrupt (checksum mismatch)")) << msg;
  EXPECT_TRUE(contains(msg, "the previous checkpoint " + good + " is still usable")) << msg;
  EXPECT_TRUE(contains(msg, "checkpoint.resume")) << msg;
  EXPECT_EQ(llmc::verify_checkpoint(good).step, 200);
  // auto resume refuses the corrupt newest checkpoint with the same message.
  msg = error_of([&] { llmc::resolve_resume("auto", run_); });
  EXPECT_TRUE(contains(msg, model) && contains(msg, good)) << msg;

  // Truncated file.
  write_checkpoint(300);
  fs::resize_file(model, fs::file_size(model) - 10);
  msg = error_of([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, model) && contains(msg, "truncated")) << msg;
  EXPECT_EQ(llmc::verify_checkpoint(good).step, 200);

  // Deleted file.
  write_checkpoint(300);
  const std::string shard = step_path(300) + "/optimizer_rank00001.safetensors";
  fs::remove(shard);
  msg = error_of([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, "checkpoint file " + shard + " is missing")) << msg;
  EXPECT_TRUE(contains(msg, good)) << msg;

  // trainer_state.json edited or broken: its CRC no longer matches DONE.
  write_checkpoint(300);
  const std::string state = step_path(300) + "/trainer_state.json";
  std::ofstream(state, std::ios::app) << "{";
  msg = error_of([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, state) && contains(msg, "corrupt")) << msg;
  msg = error_of([&] { llmc::load_trainer_state(step_path(300)); });
  EXPECT_TRUE(contains(msg, state) && contains(msg, "corrupt") && contains(msg, "invalid JSON")) << msg;

  // Missing DONE: incomplete.
  write_checkpoint(300);
  fs::remove(step_path(300) + "/DONE");
  msg = error_of([&] { llmc::verify_checkpoint(step_path(300)); });
  EXPECT_TRUE(contains(msg, "incomplete") && contains(msg, good)) << msg;
  EXPECT_EQ(llmc::verify_checkpoint(good).step, 200);
}

TEST_F(CheckpointTest, CorruptOnlyCheckpointSaysStartOver) {
  write_checkpoint(100);
  fs::resize_file(step_path(100) + "/notes.bin", 1);
  std::string msg = error_of([&] { llmc::verify_checkpoint(step_path(100)); });
  EXPECT_TRUE(contains(msg, "notes.bin") && contains(msg, "no earlier usable checkpoint")) << msg;
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
  EXPECT_TRUE(contains(error_of([&] { llmc::load_trainer_state(run_ + "/manual"); }), "format_version 99"));
  bad = ok;
  bad.erase("world_size");
  write_state(bad);
  EXPECT_TRUE(contains(error_of([&] { llmc::load_trainer_state(run_ + "/manual"); }), "'world_size'"));
  bad = ok;
  bad["files"] = {{{"name", "x"}, {"bytes", 3}}};
  write_state(bad);
  EXPECT_TRUE(contains(error_of([&] { llmc::load_trainer_state(run_ + "/manual"); }), "crc32c"));
  EXPECT_TRUE(contains(error_of([&] { llmc::load_trainer_state(run_ + "/nothing"); }), "missing"));
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

  std::string msg = error_of([&] { llmc::resolve_resume(step_path(900), run_); });
  EXPECT_TRUE(contains(msg, step_path(900)) && contains(msg, "does not exist")) << msg;
  msg = error_of([&] { llmc::resolve_resume(run_, run_); });
  EXPECT_TRUE(contains(msg, "run directory")) << msg;
  fs::remove(step_path(200) + "/DONE");
  msg = error_of([&] { llmc::resolve_resume(step_path(200), run_); });
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
  std::string msg = error_of([&] { llmc::check_world_size(st, 4, step_path(100)); });
  EXPECT_EQ(msg, llmc::world_size_mismatch_message(step_path(100), 2, 4));
  EXPECT_TRUE(contains(msg, "2 rank(s)") && contains(msg, "has 4") && contains(msg, "train.init_from")) << msg;
}

TEST_F(CheckpointTest, HostileTrainerStateIsRefused) {
  fs::create_directories(run_ + "/manual");
  const std::string dir = run_ + "/manual", state = dir + "/trainer_state.json";
  auto error_for = [&](const std::string& text) {
    std::ofstream(state, std::ios::trunc) << text;
    return error_of([&] { llmc::load_trainer_state(dir); });
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
