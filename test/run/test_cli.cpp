// test/run/test_cli: the command-line helpers that need no process: world-size detection from launcher variables,
// argument parsing results and exit codes, --help, the --dry-run report, and the --dry-run checks (data globs and
// shard headers, checkpoint.dir writable without creating it, resume none over checkpoints, files that must exist).
#include <gtest/gtest.h>

#include "test/support/temp_dir.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "llmc/core/common.h"
#include "llmc/io/checkpoint.h"
#include "llmc/run/cli.h"

namespace {

const char* const kWorldVariables[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};

// Clears the launcher variables for the test and restores them after.
struct CleanEnvironment {
  std::vector<std::pair<std::string, std::string>> saved;
  CleanEnvironment() {
    for (const char* name : kWorldVariables) {
      if (const char* v = std::getenv(name)) saved.emplace_back(name, v);
      unsetenv(name);
    }
  }
  ~CleanEnvironment() {
    for (const char* name : kWorldVariables) unsetenv(name);
    for (const auto& [name, value] : saved) setenv(name.c_str(), value.c_str(), 1);
  }
};

int parse(std::vector<std::string> args, llmc::CliOptions* out) {
  args.insert(args.begin(), "train_gpt");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return llmc::parse_cli(static_cast<int>(argv.size()), argv.data(), out);
}

}  // namespace

TEST(Cli, WorldSizeFromLauncherVariables) {
  CleanEnvironment clean;
  EXPECT_EQ(llmc::detect_world_size(), 1);
  setenv("SLURM_NTASKS", "16", 1);
  EXPECT_EQ(llmc::detect_world_size(), 16);
  setenv("PMI_SIZE", "2", 1);
  EXPECT_EQ(llmc::detect_world_size(), 2);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(llmc::detect_world_size(), 4);
  setenv("WORLD_SIZE", "8", 1);  // torchrun's variable wins
  EXPECT_EQ(llmc::detect_world_size(), 8);
  for (const char* bad : {"eight", "8x", "0", "-2", ""}) {
    setenv("WORLD_SIZE", bad, 1);
    if (*bad == '\0') {
      EXPECT_EQ(llmc::detect_world_size(), 4);  // empty = unset
      continue;
    }
    try {
      llmc::detect_world_size();
      ADD_FAILURE() << "WORLD_SIZE=" << bad << " accepted";
    } catch (const llmc::Error& e) {
      EXPECT_NE(std::string(e.what()).find("WORLD_SIZE"), std::string::npos) << e.what();
    }
  }
}

TEST(Cli, ParsesFlags) {
  llmc::CliOptions o;
  EXPECT_EQ(parse({"--config", "c.json", "--set", "train.lr=1", "--set=train.steps=3", "--dry-run", "--print-config"},
                  &o),
            -1);
  EXPECT_EQ(o.config_path, "c.json");
  EXPECT_EQ(o.overrides, (std::vector<std::string>{"train.lr=1", "train.steps=3"}));
  EXPECT_TRUE(o.dry_run);
  EXPECT_TRUE(o.print_config);
  EXPECT_FALSE(o.list_keys);
}

TEST(Cli, ExitCodes) {
  llmc::CliOptions a, b, c, d;
  EXPECT_EQ(parse({"--config", "c.json", "--bogus"}, &a), 2);
  EXPECT_EQ(parse({}, &b), 2);  // --config is required
  EXPECT_EQ(parse({"--config", "c.json", "--set", "a.b=1", "extra"}, &c), 2);  // one value per --set
  testing::internal::CaptureStdout();
  EXPECT_EQ(parse({"--list-keys"}, &d), 0);
  std::string keys = testing::internal::GetCapturedStdout();
  for (const auto& doc : llmc::config_key_docs()) EXPECT_NE(keys.find(doc.key), std::string::npos) << doc.key;
}

TEST(Cli, HelpDescribesMultiGpuTraining) {
  llmc::CliOptions o;
  testing::internal::CaptureStdout();
  EXPECT_EQ(parse({"--help"}, &o), 0);
  const std::string help = testing::internal::GetCapturedStdout();
  EXPECT_EQ(help.find("not in this build"), std::string::npos) << help;
  for (const char* part : {"process per GPU", "scripts/run_local.sh", "scripts/run_mpi.sh",
                           "scripts/slurm_srun.sbatch", "MASTER_ADDR", "Multi-GPU and multi-node"})
    EXPECT_NE(help.find(part), std::string::npos) << part << " not in:\n" << help;
}

TEST(Cli, DryRunReport) {
  nlohmann::json j = {{"model", {{"preset", "gpt2-124m"}}},
                      {"data", {{"train", "a_*.bin"}}},
                      {"train", {{"micro_batch", 16}, {"seq_len", 1024}, {"global_batch_tokens", 524288}}}};
  llmc::RunConfig cfg = llmc::load_config_json(j, {}, 4);
  std::string report = llmc::dry_run_report(cfg, 4);
  for (const char* part : {"124,475,904", "124,439,808", "gpt2-124m", "8 accumulation steps", "524,288 tokens",
                           "memory/GPU", "ZeRO-1", "FLOPs/token", "bf16", "micro_batch=16"})
    EXPECT_NE(report.find(part), std::string::npos) << part << " not in:\n" << report;
  EXPECT_EQ(llmc::with_thousands(0), "0");
  EXPECT_EQ(llmc::with_thousands(999), "999");
  EXPECT_EQ(llmc::with_thousands(1000), "1,000");
  EXPECT_EQ(llmc::with_thousands(124475904), "124,475,904");
}

namespace {

namespace fs = std::filesystem;

class DryRunChecksTest : public llmc_test::TempDirTest {
 protected:
  // A uint16 token shard of n tokens in llm.c's format; `bytes_short` bytes fewer than its header says.
  void write_shard(const std::string& file, int32_t n, int32_t magic = 20240520, size_t bytes_short = 0) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = 1;
    header[2] = n;
    std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    bytes.append(static_cast<size_t>(n) * 2 - bytes_short, '\0');
    std::ofstream(file, std::ios::binary) << bytes;
  }
  llmc::RunConfig config(const std::vector<std::string>& overrides) {
    nlohmann::json j = {{"model", {{"preset", "gpt2-tiny"}}},
                        {"data", {{"train", path("train_*.bin")}, {"val", path("val_*.bin")}}},
                        {"train", {{"micro_batch", 2}, {"seq_len", 64}}},
                        {"sample", {{"tokens", 0}}}};
    return llmc::load_config_json(j, overrides);
  }
  static std::string joined(const std::vector<std::string>& lines) {
    std::string out;
    for (const std::string& l : lines) out += l + "\n";
    return out;
  }
};

bool has(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& l : lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_F(DryRunChecksTest, DataGlobsAndShardHeaders) {
  // Nothing matches: both globs are named.
  llmc::DryRunChecks c = llmc::dry_run_checks(config({}));
  EXPECT_TRUE(has(c.problems, "data.train: no files match '" + path("train_*.bin") + "'")) << joined(c.problems);
  EXPECT_TRUE(has(c.problems, "data.val: no files match '" + path("val_*.bin") + "'")) << joined(c.problems);
  // Valid shards: counted from the headers.
  write_shard(path("train_000.bin"), 1000);
  write_shard(path("train_001.bin"), 500);
  write_shard(path("val_000.bin"), 300);
  c = llmc::dry_run_checks(config({}));
  EXPECT_TRUE(c.problems.empty()) << joined(c.problems);
  EXPECT_TRUE(has(c.passed, "data.train: 2 shard(s) match '" + path("train_*.bin") + "', 1,500 tokens"))
      << joined(c.passed);
  EXPECT_TRUE(has(c.passed, "data.val: 1 shard(s)")) << joined(c.passed);
  // A truncated shard and one with a bad magic: each named.
  write_shard(path("train_002.bin"), 100, 20240520, /*bytes_short=*/6);
  write_shard(path("val_001.bin"), 100, /*magic=*/12345);
  c = llmc::dry_run_checks(config({}));
  EXPECT_TRUE(has(c.problems, "data.train: data shard '" + path("train_002.bin") + "'")) << joined(c.problems);
  EXPECT_TRUE(has(c.problems, "truncated")) << joined(c.problems);
  EXPECT_TRUE(has(c.problems, "data.val: data shard '" + path("val_001.bin") + "': bad magic 12345"))
      << joined(c.problems);
}

TEST_F(DryRunChecksTest, CheckpointDirIsWritableAndNothingIsCreated) {
  write_shard(path("train_000.bin"), 1000);
  write_shard(path("val_000.bin"), 1000);
  const std::string run = path("runs/a/b");
  llmc::DryRunChecks c = llmc::dry_run_checks(config({"checkpoint.dir=" + run}));
  EXPECT_TRUE(c.problems.empty()) << joined(c.problems);
  EXPECT_TRUE(has(c.passed, "checkpoint.dir " + run + ": can be created")) << joined(c.passed);
  EXPECT_FALSE(fs::exists(path("runs")));  // a dry run creates nothing
  fs::create_directories(run);
  EXPECT_TRUE(has(llmc::dry_run_checks(config({"checkpoint.dir=" + run})).passed, run + ": writable"));
  // Under a regular file: it can never be created.
  std::ofstream(path("file")) << "x";
  c = llmc::dry_run_checks(config({"checkpoint.dir=" + path("file/run"), "log.jsonl=" + path("file/m.jsonl")}));
  EXPECT_TRUE(has(c.problems, "checkpoint.dir " + path("file/run") + ": it cannot be created: " + path("file") +
                                  " is not a directory")) << joined(c.problems);
  EXPECT_TRUE(has(c.problems, "log.jsonl " + path("file/m.jsonl"))) << joined(c.problems);
  c = llmc::dry_run_checks(config({"checkpoint.dir=" + path("file")}));
  EXPECT_TRUE(has(c.problems, "checkpoint.dir " + path("file") + ": it exists and is not a directory"))
      << joined(c.problems);
  // A read-only file system (where there is one): not writable.
  if (access("/proc/sys", F_OK) == 0 && access("/proc/sys", W_OK) != 0) {
    c = llmc::dry_run_checks(config({"checkpoint.dir=/proc/sys/llm8_run"}));
    EXPECT_TRUE(has(c.problems, "/proc/sys is not writable")) << joined(c.problems);
  }
}

TEST_F(DryRunChecksTest, ResumeNoneOverCheckpointsAndFilesThatMustExist) {
  write_shard(path("train_000.bin"), 1000);
  write_shard(path("val_000.bin"), 1000);
  const std::string run = path("run");
  {
    llmc::CheckpointWriter w(run, 100);
    llmc::TrainerState st;
    st.step = 100;
    w.commit(st, 0);
  }
  llmc::DryRunChecks c = llmc::dry_run_checks(config({"checkpoint.dir=" + run, "checkpoint.resume=none"}));
  EXPECT_TRUE(has(c.problems, "checkpoint.dir " + run + " already holds 1 checkpoint(s)") &&
              has(c.problems, "checkpoint.overwrite=true")) << joined(c.problems);
  c = llmc::dry_run_checks(config({"checkpoint.dir=" + run, "checkpoint.resume=none", "checkpoint.overwrite=true"}));
  EXPECT_TRUE(c.problems.empty()) << joined(c.problems);
  EXPECT_TRUE(has(c.passed, "would be moved into " + run + "/abandoned/")) << joined(c.passed);
  EXPECT_TRUE(fs::exists(llmc::step_dir_path(run, 100)));  // nothing moved by a dry run
  EXPECT_TRUE(llmc::dry_run_checks(config({"checkpoint.dir=" + run})).problems.empty());  // auto resumes it

  c = llmc::dry_run_checks(config({"checkpoint.resume=" + path("nothing"), "train.init_from=" + path("none.bin"),
                                   "sample.tokens=8", "data.tokenizer=" + path("encoder.json")}));
  EXPECT_TRUE(has(c.problems, "checkpoint.resume: " + path("nothing") + " is not a checkpoint step directory"))
      << joined(c.problems);
  EXPECT_TRUE(has(c.problems, "train.init_from: " + path("none.bin") + " does not exist")) << joined(c.problems);
  EXPECT_TRUE(has(c.problems, "data.tokenizer: " + path("encoder.json"))) << joined(c.problems);
  EXPECT_EQ(c.problems.size(), 3u) << joined(c.problems);
}
