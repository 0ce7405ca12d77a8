// test/run/test_metrics: GPU peak lookup, MFU, duration formatting, the console line, the throughput average and
// ETA, and JSONL records (each line parses; non-writer ranks write nothing); the log is never truncated (a fresh run
// rotates it, a resume moves the records after its checkpoint to a side file, nothing lost, no step repeated); write
// errors (a full device, the file removed or replaced) stop the run naming the file.
#include <gtest/gtest.h>

#include "test/support/temp_dir.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "llmc/core/common.h"
#include "llmc/run/metrics.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));  // throws if a line is not one JSON object
  return out;
}

class MetricsTest : public llmc_test::TempDirTest {
};

}  // namespace

TEST(GpuPeaks, KnownDevices) {
  struct Case {
    const char* name;
    double bf16, fp8;
  } cases[] = {
      {"NVIDIA H100 80GB HBM3", 989, 1979}, {"NVIDIA H100 PCIe", 756, 1513},   {"NVIDIA H200", 989, 1979},
      {"NVIDIA A100-SXM4-80GB", 312, 0},    {"NVIDIA A100-PCIE-40GB", 312, 0}, {"NVIDIA B200", 2250, 4500},
      {"NVIDIA GH200 480GB", 989, 1979},    {"nvidia h100 80gb hbm3", 989, 1979},
  };
  for (const Case& c : cases) {
    llmc::GpuPeaks p{-1, -1};
    ASSERT_TRUE(llmc::gpu_peaks(c.name, &p)) << c.name;
    EXPECT_EQ(p.bf16_tflops, c.bf16) << c.name;
    EXPECT_EQ(p.fp8_tflops, c.fp8) << c.name;
  }
}

TEST(GpuPeaks, UnknownDevices) {
  llmc::GpuPeaks p{-1, -1};
  EXPECT_FALSE(llmc::gpu_peaks("Tesla V100-SXM2-16GB", &p));
  EXPECT_FALSE(llmc::gpu_peaks("", &p));
  EXPECT_EQ(p.bf16_tflops, -1);  // untouched
}

TEST(Mfu, PercentAndUnknown) {
  // 1e12 FLOPs/token at 494.5 tok/s on one 989-TFLOPS GPU = 50%.
  EXPECT_NEAR(*llmc::mfu_percent(1e12, 494.5, 989, 1), 50.0, 1e-9);
  EXPECT_NEAR(*llmc::mfu_percent(1e12, 989.0, 989, 2), 50.0, 1e-9);
  EXPECT_FALSE(llmc::mfu_percent(1e12, 100, 0, 1));   // unknown peak
  EXPECT_FALSE(llmc::mfu_percent(1e12, 0, 989, 1));   // no throughput yet
  EXPECT_FALSE(llmc::mfu_percent(0, 100, 989, 1));
  EXPECT_FALSE(llmc::mfu_percent(1e12, std::numeric_limits<double>::infinity(), 989, 1));
}

TEST(FormatDuration, Examples) {
  EXPECT_EQ(llmc::format_duration(0), "0s");
  EXPECT_EQ(llmc::format_duration(42.4), "42s");
  EXPECT_EQ(llmc::format_duration(185), "3m05s");
  EXPECT_EQ(llmc::format_duration(3720), "1h02m");
  EXPECT_EQ(llmc::format_duration(3599.6), "1h00m");
  EXPECT_EQ(llmc::format_duration(2 * 86400 + 3 * 3600 + 59), "2d03h");
  EXPECT_EQ(llmc::format_duration(-1), "n/a");
  EXPECT_EQ(llmc::format_duration(std::nan("")), "n/a");
  EXPECT_EQ(llmc::format_duration(std::numeric_limits<double>::infinity()), "n/a");
}

TEST_F(MetricsTest, ConsoleLineThroughputEtaAndJsonl) {
  const std::string path = TempDirTest::path("sub/metrics.jsonl");  // parent dirs are created
  llmc::MetricsOptions opt;
  opt.jsonl_path = path;
  opt.total_steps = 10;
  opt.flops_per_token = 1e12;
  opt.peak_tflops = 1000;
  opt.console = nullptr;
  {
    llmc::MetricsLogger log(opt);
    // Step 1 is slow (warm-up) and is left out of the average.
    std::string line1 = log.log_train({1, 5.0, 1e-4, 2.0, 1000.0, 100.0, 12.34});
    EXPECT_EQ(line1,
              "step 1/10 | loss 5.0000 | lr 1.00e-04 | norm 2.000 | 1000.0 ms | 100 tok/s | MFU 10.0% | mem 12.3 GiB | "
              "ETA 9s");
    // Steps 2..3 at 1000 tok/s: the bias-corrected average is exactly 1000.
    log.log_train({2, 4.0, 2e-4, 1.0, 100.0, 100.0, -1});
    std::string line3 = log.log_train({3, 3.5, 3e-4, 0.5, 100.0, 100.0, -1});
    EXPECT_NEAR(log.tokens_per_second(), 1000.0, 1e-9);
    EXPECT_NEAR(log.eta_seconds(), 0.7, 1e-9);  // 7 steps x 100 tokens / 1000 tok/s
    EXPECT_NE(line3.find("| 1000 tok/s | MFU 100.0% | mem n/a | ETA 1s"), std::string::npos) << line3;
    // A step at 2000 tok/s: EMA over the samples 1000, 1000, 2000 with beta 0.95, divided by 1 - 0.95^3.
    log.log_train({4, 3.0, 4e-4, 0.4, 50.0, 100.0, -1});
    const double ema = 0.05 * (0.95 * 0.95 * 1000 + 0.95 * 1000 + 2000) / (1 - std::pow(0.95, 3));
    EXPECT_NEAR(log.tokens_per_second(), ema, 1e-9);
    log.log_eval(4, 3.25);
    log.log_sample(4, std::string("Hello \xe2\x82") + " world");  // a cut multi-byte character
    log.log_record({{"type", "telemetry"}, {"step", 4}, {"amax", 1.5}});
    EXPECT_THROW(log.log_record({{"step", 4}}), llmc::Error);
    log.log_train({5, std::nan(""), 5e-4, 0.3, 50.0, 100.0, -1});
  }
  std::vector<json> lines = read_jsonl(path);
  ASSERT_EQ(lines.size(), 8u);
  EXPECT_EQ(lines[0]["type"], "train");
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[0]["loss"], 5.0);
  EXPECT_EQ(lines[0]["mem_gib"], 12.34);
  EXPECT_TRUE(lines[1]["mem_gib"].is_null());
  EXPECT_NEAR(lines[2]["tok_s"].get<double>(), 1000.0, 1e-9);
  EXPECT_NEAR(lines[2]["mfu"].get<double>(), 100.0, 1e-9);
  EXPECT_EQ(lines[4], (json{{"type", "eval"}, {"step", 4}, {"val_loss", 3.25}}));
  EXPECT_EQ(lines[5]["type"], "sample");
  EXPECT_EQ(lines[5]["text"], "Hello \xef\xbf\xbd world");  // replaced by U+FFFD
  EXPECT_EQ(lines[6]["type"], "telemetry");
  EXPECT_TRUE(lines[7]["loss"].is_null());  // NaN is written as null
  // Records start with "type".
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first.rfind("{\"type\":\"train\",\"step\":1,", 0), 0u) << first;

  // A resume from the checkpoint of step 5 appends after the records up to step 5.
  opt.resume_step = 5;
  { llmc::MetricsLogger(opt).log_eval(6, 3.0); }
  EXPECT_EQ(read_jsonl(path).size(), 9u);
}

namespace {

// Records as a run writes them: train records for steps first..last, an eval record every 5 steps.
void log_steps(const llmc::MetricsOptions& opt, int first, int last) {
  llmc::MetricsLogger log(opt);
  for (int step = first; step <= last; step++) {
    log.log_train({step, 1.0, 1e-3, 1.0, 10.0, 1000.0, -1});
    if (step % 5 == 0) log.log_eval(step, 2.0);
  }
}

std::vector<int> train_steps(const std::string& path) {
  std::vector<int> out;
  for (const json& r : read_jsonl(path))
    if (r["type"] == "train") out.push_back(r["step"].get<int>());
  return out;
}

std::vector<int> range(int first, int last) {
  std::vector<int> out;
  for (int i = first; i <= last; i++) out.push_back(i);
  return out;
}

// A logger's options writing to path, printing nothing.
llmc::MetricsOptions jsonl_options(const std::string& path) {
  llmc::MetricsOptions opt;
  opt.jsonl_path = path;
  opt.total_steps = 100;
  opt.console = nullptr;
  return opt;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// One logger writing jsonl_path and printing to console_path logs each (report, at) in turn; returns the console.
std::string log_memory_reports(const std::string& jsonl_path, const std::string& console_path,
                               const std::vector<std::pair<llmc::MemoryReport, std::string>>& reports) {
  llmc::MetricsOptions opt = jsonl_options(jsonl_path);
  FILE* console = std::fopen(console_path.c_str(), "w");
  opt.console = console;
  {
    llmc::MetricsLogger logger(opt);
    for (const auto& [report, at] : reports) logger.log_memory(report, at);
  }
  std::fclose(console);
  return read_text(console_path);
}

}  // namespace

TEST_F(MetricsTest, AFreshRunRotatesAnExistingLogInsteadOfTruncatingIt) {
  const std::string path = TempDirTest::path("metrics.jsonl");
  llmc::MetricsOptions opt = jsonl_options(path);
  log_steps(opt, 1, 3);
  log_steps(opt, 1, 2);  // a second fresh run in the same place
  log_steps(opt, 1, 4);  // and a third
  EXPECT_EQ(train_steps(path + ".1"), range(1, 3));  // the oldest
  EXPECT_EQ(train_steps(path + ".2"), range(1, 2));
  EXPECT_EQ(train_steps(path), range(1, 4));
  // An empty log is simply reused.
  std::ofstream(path, std::ios::trunc).close();
  log_steps(opt, 1, 1);
  EXPECT_FALSE(fs::exists(path + ".3"));
  EXPECT_EQ(train_steps(path), range(1, 1));
}

TEST_F(MetricsTest, AResumeMovesTheRecordsAfterItsCheckpointToASideFile) {
  const std::string path = TempDirTest::path("metrics.jsonl");
  const std::string console_path = TempDirTest::path("console.txt");
  llmc::MetricsOptions opt = jsonl_options(path);
  log_steps(opt, 1, 13);  // checkpoint at step 10, crash after step 13
  {  // the resumed run's "resume" record, then steps 11..20
    opt.resume_step = 10;
    FILE* console = std::fopen(console_path.c_str(), "w");
    opt.console = console;
    llmc::MetricsLogger log(opt);
    std::fclose(console);
    opt.console = nullptr;
    log.log_record({{"type", "resume"}, {"step", 10}});
  }
  log_steps(opt, 11, 20);
  EXPECT_EQ(train_steps(path), range(1, 20));  // every step once
  EXPECT_EQ(train_steps(path + ".after-step-10"), range(11, 13));  // what the crashed run logged after its checkpoint
  std::vector<json> side = read_jsonl(path + ".after-step-10");
  EXPECT_EQ(side.size(), 3u);
  const std::string said = read_text(console_path);
  EXPECT_NE(said.find("3 record(s) of " + path + " written after the checkpoint of step 10 are moved to " + path +
                      ".after-step-10"), std::string::npos) << said;
  // The eval record at step 10 was written before the checkpoint: it stays.
  int evals_at_10 = 0;
  for (const json& r : read_jsonl(path)) evals_at_10 += r["type"] == "eval" && r["step"] == 10;
  EXPECT_EQ(evals_at_10, 1);

  // Resumed from step 20 (nothing after it to move), then rolled back to step 10 again: its own side file.
  opt.resume_step = 20;
  log_steps(opt, 21, 22);
  EXPECT_FALSE(fs::exists(path + ".after-step-20"));
  opt.resume_step = 10;
  log_steps(opt, 11, 11);
  EXPECT_EQ(train_steps(path + ".after-step-10.2"), range(11, 22));
  EXPECT_EQ(train_steps(path + ".after-step-10"), range(11, 13));  // untouched
  EXPECT_EQ(train_steps(path), range(1, 11));

  // A record cut short by a crash (no newline) goes to the side file too, even before the checkpoint's step.
  std::ofstream(path, std::ios::app) << "{\"type\":\"train\",\"st";
  opt.resume_step = 11;
  log_steps(opt, 12, 12);
  EXPECT_EQ(train_steps(path), range(1, 12));  // every line parses again
  EXPECT_EQ(read_text(path + ".after-step-11"), "{\"type\":\"train\",\"st");
  // Nothing after the checkpoint: no side file.
  opt.resume_step = 12;
  log_steps(opt, 13, 13);
  EXPECT_FALSE(fs::exists(path + ".after-step-12"));
  EXPECT_EQ(train_steps(path), range(1, 13));
}

TEST_F(MetricsTest, AWriteErrorStopsTheRunNamingTheFile) {
  llmc::MetricsOptions opt = jsonl_options("/dev/full");  // every write fails with ENOSPC (a device is never rotated)
  for (int resume_step : {-1, 3}) {
    opt.resume_step = resume_step;
    llmc::MetricsLogger log(opt);
    try {
      log.log_train({4, 1.0, 1e-3, 1.0, 10.0, 1000.0, -1});
      ADD_FAILURE() << "a write to /dev/full did not fail";
    } catch (const llmc::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("/dev/full (log.jsonl)"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::strerror(ENOSPC)), std::string::npos) << msg;
    }
  }
  EXPECT_TRUE(fs::exists("/dev/full"));
}

TEST_F(MetricsTest, TheLogRemovedOrReplacedDuringTheRunStopsIt) {
  const std::string path = TempDirTest::path("metrics.jsonl");
  llmc::MetricsOptions opt = jsonl_options(path);
  {
    llmc::MetricsLogger log(opt);
    log.log_eval(1, 2.0);
    fs::remove(path);
    try {
      log.log_eval(2, 2.0);
      ADD_FAILURE() << "writing to a removed log did not fail";
    } catch (const llmc::Error& e) {
      EXPECT_NE(std::string(e.what()).find(path + " (log.jsonl) was removed or replaced"), std::string::npos)
          << e.what();
    }
  }
  {
    llmc::MetricsLogger log(opt);
    log.log_eval(1, 2.0);
    std::ofstream(path + ".other") << "{}\n";
    fs::rename(path + ".other", path);  // replaced by another file
    EXPECT_THROW(log.log_eval(2, 2.0), llmc::Error);
  }
}

TEST_F(MetricsTest, ADeviceIsWrittenAsIs) {
  llmc::MetricsOptions opt = jsonl_options("/dev/null");
  for (int resume_step : {-1, 5}) {
    opt.resume_step = resume_step;
    llmc::MetricsLogger log(opt);
    EXPECT_NO_THROW(log.log_eval(6, 2.0));
  }
  EXPECT_FALSE(fs::exists("/dev/null.1"));
}

TEST_F(MetricsTest, UnknownPeakPrintsNotAvailable) {
  llmc::MetricsOptions opt;
  opt.total_steps = 2;
  opt.flops_per_token = 1e9;
  opt.peak_tflops = 0;
  opt.console = nullptr;
  llmc::MetricsLogger log(opt);
  std::string line = log.log_train({1, 1.0, 1e-3, 1.0, 10.0, 1000.0, -1});
  EXPECT_NE(line.find("MFU n/a"), std::string::npos) << line;
  EXPECT_EQ(line.find('-'), line.find("1.00e-03") + 5) << line;  // the only '-' is the lr exponent's
}

TEST_F(MetricsTest, ConsoleEveryAndLastStep) {
  const std::string console_path = path("console.txt");
  fs::create_directories(dir_);
  FILE* console = std::fopen(console_path.c_str(), "w");
  ASSERT_NE(console, nullptr);
  llmc::MetricsOptions opt;
  opt.total_steps = 7;
  opt.console_every = 3;
  opt.console = console;
  {
    llmc::MetricsLogger log(opt);
    for (int step = 1; step <= 7; step++) log.log_train({step, 1.0, 1e-3, 1.0, 10.0, 1000.0, -1});
  }
  std::fclose(console);
  std::ifstream in(console_path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);  // steps 3, 6 and the last one
  EXPECT_EQ(lines[0].rfind("step 3/7 |", 0), 0u);
  EXPECT_EQ(lines[1].rfind("step 6/7 |", 0), 0u);
  EXPECT_EQ(lines[2].rfind("step 7/7 |", 0), 0u);
}

TEST_F(MetricsTest, NonWriterRankWritesNothing) {
  const std::string path = TempDirTest::path("metrics.jsonl");
  llmc::MetricsOptions opt;
  opt.writer = false;
  opt.jsonl_path = path;
  opt.total_steps = 3;
  opt.console = nullptr;
  llmc::MetricsLogger log(opt);
  log.log_train({1, 1.0, 1e-3, 1.0, 10.0, 1000.0, -1});
  log.log_eval(1, 1.0);
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(MetricsTest, UnwritableJsonlPathIsAnError) {
  fs::create_directories(dir_);
  std::ofstream(path("file")) << "x";
  llmc::MetricsOptions opt;
  opt.jsonl_path = path("file/metrics.jsonl");  // parent is a file
  opt.console = nullptr;
  try {
    llmc::MetricsLogger log(opt);
    FAIL();
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("log.jsonl"), std::string::npos) << e.what();
  }
}

// The memory line and record: the peak, what the run allocated above the memory in use before it, the estimate and
// its relative error to that.
TEST_F(MetricsTest, MemoryLineAndRecordCompareTheEstimateWithTheMeasuredPeak) {
  const std::string path = TempDirTest::path("metrics.jsonl");
  const std::string console_path = TempDirTest::path("console.txt");
  const size_t GiB = size_t{1} << 30;
  llmc::MemoryReport m;
  m.step = 1;
  m.peak_bytes = 21 * GiB;
  m.before_run_bytes = GiB;
  m.estimate_bytes = 19 * GiB;  // 20 GiB allocated by the run: 5% under
  EXPECT_EQ(m.run_bytes(), 20 * GiB);
  EXPECT_DOUBLE_EQ(m.estimate_error(), -0.05);
  llmc::MemoryReport end = m;
  end.step = 100;
  end.estimate_bytes = 22 * GiB;
  const std::string said = log_memory_reports(path, console_path, {{m, "first_step"}, {end, "end"}});
  EXPECT_NE(said.find("memory after step 1 (first step): peak 21.00 GiB in use (cudaMemGetInfo), 20.00 GiB of it "
                      "allocated by the run (1.00 GiB in use before it: CUDA context, NCCL, other processes) | estimate 19.00 GiB, "
                      "within 5.0% of measured (under by 1.00 GiB)"),
            std::string::npos) << said;
  EXPECT_NE(said.find("memory after step 100 (end of run)"), std::string::npos) << said;
  EXPECT_NE(said.find("within 10.0% of measured (over by 2.00 GiB)"), std::string::npos) << said;
  EXPECT_EQ(said.find("another process"), std::string::npos) << said;  // plans this close get no hint
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> records;
  while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["type"], "memory");
  EXPECT_EQ(records[0]["step"], 1);
  EXPECT_EQ(records[0]["at"], "first_step");
  EXPECT_EQ(records[0]["source"], "cudaMemGetInfo");
  EXPECT_EQ(records[0]["peak_bytes"].get<size_t>(), 21 * GiB);
  EXPECT_EQ(records[0]["before_run_bytes"].get<size_t>(), GiB);
  EXPECT_EQ(records[0]["run_bytes"].get<size_t>(), 20 * GiB);
  EXPECT_EQ(records[0]["estimate_bytes"].get<size_t>(), 19 * GiB);
  EXPECT_DOUBLE_EQ(records[0]["estimate_error"].get<double>(), -0.05);
  EXPECT_EQ(records[1]["at"], "end");
  EXPECT_DOUBLE_EQ(records[1]["estimate_error"].get<double>(), 0.1);
  // Nothing measured: no error to give.
  llmc::MemoryReport none;
  EXPECT_TRUE(std::isnan(none.estimate_error()));
}

// A measured peak far above the plan (another training on the same GPU grew after this one started): the line says
// that cudaMemGetInfo counts the whole GPU; the record is unchanged.
TEST_F(MetricsTest, MemoryLineSaysWhenThePeakMayHoldAnotherProcess) {
  const std::string path = TempDirTest::path("metrics.jsonl");
  const std::string console_path = TempDirTest::path("console.txt");
  const size_t GiB = size_t{1} << 30;
  llmc::MemoryReport m;
  m.step = 1;
  m.peak_bytes = 22 * GiB;
  m.before_run_bytes = GiB;
  m.estimate_bytes = 10 * GiB;  // 21 GiB measured: the plan 52% under
  const std::string said = log_memory_reports(path, console_path, {{m, "first_step"}});
  EXPECT_NE(said.find("within 52.4% of measured (under by 11.00 GiB); cudaMemGetInfo counts the whole GPU, so memory "
                      "that another process took after this run started counts as this run's (nvidia-smi lists the "
                      "processes)\n"),
            std::string::npos)
      << said;
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const nlohmann::json record = nlohmann::json::parse(line);
  EXPECT_EQ(record["run_bytes"].get<size_t>(), 21 * GiB);
  EXPECT_NEAR(record["estimate_error"].get<double>(), -11.0 / 21.0, 1e-12);
}
