// test/integration/test_cli: the command-line helpers that need no process: world-size detection from launcher variables,
// argument parsing results and exit codes, and the --dry-run report.
#include <gtest/gtest.h>

#include <cstdlib>

#include "llmc/run/cli.h"
#include "llmc/core/common.h"

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
