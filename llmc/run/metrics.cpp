// llmc/run/metrics.cpp: implementation of the GPU peak table, MFU, duration formatting and the console / JSONL logger.
#include "llmc/run/metrics.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "llmc/core/common.h"

namespace llmc {

using json = nlohmann::json;

namespace {

constexpr double kEmaBeta = 0.95;  // tok/s moving-average decay (as llm.c)

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// A finite number as JSON, or null.
nlohmann::ordered_json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

}  // namespace

bool gpu_peaks(const std::string& device_name, GpuPeaks* peaks) {
  // Dense peaks from NVIDIA's datasheets. More specific names come first ("gh200" before "h200", "h100 pcie" and
  // "h100 nvl" before "h100", "gb200" before "b200").
  struct Row {
    const char* name_part;
    GpuPeaks peaks;
  };
  static const Row table[] = {
      {"gh200", {989, 1979}},  {"h200", {989, 1979}},     {"h100 pcie", {756, 1513}}, {"h100 nvl", {835, 1671}},
      {"h100", {989, 1979}},   {"h800", {989, 1979}},     {"a100", {312, 0}},         {"gb200", {2500, 5000}},
      {"b200", {2250, 4500}},
  };
  const std::string name = lowercase(device_name);
  for (const Row& row : table)
    if (name.find(row.name_part) != std::string::npos) {
      if (peaks) *peaks = row.peaks;
      return true;
    }
  return false;
}

std::optional<double> mfu_percent(double flops_per_token, double tokens_per_second, double peak_tflops_per_gpu,
                                  int num_gpus) {
  if (!(flops_per_token > 0) || !(tokens_per_second > 0) || !(peak_tflops_per_gpu > 0) || num_gpus < 1 ||
      !std::isfinite(flops_per_token) || !std::isfinite(tokens_per_second) || !std::isfinite(peak_tflops_per_gpu))
    return std::nullopt;
  return 100.0 * flops_per_token * tokens_per_second / (peak_tflops_per_gpu * 1e12 * num_gpus);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "n/a";
  const long long s = std::llround(seconds);
  if (s < 60) return strformat("%llds", s);
  if (s < 3600) return strformat("%lldm%02llds", s / 60, s % 60);
  if (s < 86400) return strformat("%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return strformat("%lldd%02lldh", s / 86400, (s % 86400) / 3600);
}

namespace {

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The first of base, base.2, base.3, ... that does not exist.
std::string first_free_name(const std::string& base) {
  std::error_code ec;
  std::string name = base;
  for (int k = 2; std::filesystem::exists(name, ec); k++) name = strformat("%s.%d", base.c_str(), k);
  return name;
}

// The "step" of a JSONL record, or nullopt (no integer step, or not a JSON object).
std::optional<long long> record_step(const std::string& line) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  return j["step"].get<long long>();
}

[[noreturn]] void fail_file(const char* what, const std::string& path, int err) {
  throw_error("metrics: %s %s (log.jsonl): %s (the run stops rather than lose records; hint: is the disk full?)", what,
              path.c_str(), std::strerror(err));
}

// Copies bytes [offset, end) of `from` into the new file `to`, fsynced.
void copy_tail(const std::string& from, size_t offset, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) fail_file("cannot read the JSONL metrics file", from, errno);
  in.seekg(static_cast<std::streamoff>(offset));
  FILE* out = std::fopen(to.c_str(), "wx");
  if (!out) fail_file("cannot create the side file", to, errno);
  std::vector<char> buf(size_t(1) << 20);
  bool ok = true;
  while (ok && in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const size_t n = static_cast<size_t>(in.gcount());
    ok = std::fwrite(buf.data(), 1, n, out) == n;
  }
  ok = ok && !in.bad() && std::fflush(out) == 0 && ::fsync(fileno(out)) == 0;
  const int err = errno;
  if (std::fclose(out) != 0 || !ok) fail_file("cannot write the side file", to, ok ? errno : err);
}

}  // namespace

MetricsLogger::MetricsLogger(const MetricsOptions& options) : options_(options) {
  if (!options_.writer || options_.jsonl_path.empty()) return;
  const std::string& path = options_.jsonl_path;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (is_regular_file(path)) prepare_file();
  jsonl_ = std::fopen(path.c_str(), "a");
  if (!jsonl_) fail_file("cannot open the JSONL metrics file", path, errno);
  struct stat st;
  if (::fstat(fileno(jsonl_), &st) == 0 && S_ISREG(st.st_mode)) {
    jsonl_dev_ = st.st_dev;
    jsonl_ino_ = st.st_ino;
  }
}

void MetricsLogger::prepare_file() {
  const std::string& path = options_.jsonl_path;
  if (options_.resume_step < 0) {  // a fresh run: the old log is kept under the first free number
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) == 0 || ec) return;
    std::string rotated = path + ".1";
    for (int k = 2; std::filesystem::exists(rotated, ec); k++) rotated = strformat("%s.%d", path.c_str(), k);
    if (::rename(path.c_str(), rotated.c_str()) != 0) fail_file("cannot rotate the JSONL metrics file", path, errno);
    say(strformat("the existing %s is kept as %s (a new run starts a new log)", path.c_str(), rotated.c_str()));
    return;
  }
  // Resuming from step S: the records after the checkpoint start at the first record whose step exceeds S (or at a
  // last line cut short by a crash).
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_file("cannot read the JSONL metrics file", path, errno);
  size_t offset = 0, cut = std::string::npos, moved = 0;
  for (std::string line; std::getline(in, line);) {
    const bool partial = in.eof();  // no newline after it
    if (cut == std::string::npos) {
      const std::optional<long long> step = record_step(line);
      if (partial || (step && *step > options_.resume_step)) cut = offset;
    }
    if (cut != std::string::npos) moved++;
    offset += line.size() + (partial ? 0 : 1);
  }
  if (in.bad()) fail_file("cannot read the JSONL metrics file", path, errno);
  in.close();
  if (cut == std::string::npos) return;
  const std::string side = first_free_name(strformat("%s.after-step-%d", path.c_str(), options_.resume_step));
  copy_tail(path, cut, side);  // the copy first (fsynced), then the cut: a crash in between loses nothing
  if (::truncate(path.c_str(), static_cast<off_t>(cut)) != 0)
    fail_file("cannot truncate the JSONL metrics file", path, errno);
  say(strformat("%zu record(s) of %s written after the checkpoint of step %d are moved to %s (the log continues from "
                "that checkpoint)", moved, path.c_str(), options_.resume_step, side.c_str()));
}

void MetricsLogger::say(const std::string& message) const {
  if (!options_.console) return;
  std::fprintf(options_.console, "metrics: %s\n", message.c_str());
  std::fflush(options_.console);
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_) std::fclose(jsonl_);
}

// Records are built as ordered_json so that "type" and "step" come first in every line.
template <class Json>
void MetricsLogger::write_line(const Json& record) {
  if (!jsonl_) return;
  const std::string& path = options_.jsonl_path;
  const std::string line = record.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  errno = 0;
  if (std::fwrite(line.data(), 1, line.size(), jsonl_) != line.size() || std::fflush(jsonl_) != 0)
    fail_file("cannot write the JSONL metrics file", path, errno ? errno : EIO);
  if (jsonl_ino_ != 0) {  // a regular file: is it still the one at the path?
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || st.st_dev != jsonl_dev_ || st.st_ino != jsonl_ino_)
      throw_error("metrics: the JSONL metrics file %s (log.jsonl) was removed or replaced while the run wrote it: the "
                  "run stops rather than write records nobody can read (restore the file, or resume from the last "
                  "checkpoint)", path.c_str());
  }
}

std::string MetricsLogger::log_train(const TrainStepMetrics& m) {
  const double step_tok_s = m.step_ms > 0 ? m.tokens / (m.step_ms / 1000.0) : 0.0;
  steps_seen_++;
  if (steps_seen_ > 1 && step_tok_s > 0) {  // the first step after a (re)start is skipped
    ema_samples_++;
    ema_tok_s_ = kEmaBeta * ema_tok_s_ + (1.0 - kEmaBeta) * step_tok_s;
  }
  last_tok_s_ = ema_samples_ > 0 ? tokens_per_second() : step_tok_s;
  const int remaining = std::max(0, options_.total_steps - m.step);
  eta_s_ = last_tok_s_ > 0 ? remaining * m.tokens / last_tok_s_ : -1.0;
  const std::optional<double> mfu =
      mfu_percent(options_.flops_per_token, last_tok_s_, options_.peak_tflops, options_.world_size);

  const std::string mfu_text = mfu ? strformat("MFU %.1f%%", *mfu) : std::string("MFU n/a");
  const std::string mem_text = m.mem_gib >= 0 ? strformat("mem %.1f GiB", m.mem_gib) : std::string("mem n/a");
  const std::string line =
      strformat("step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | %s | %s | ETA %s", m.step,
                options_.total_steps, m.loss, m.lr, m.grad_norm, m.step_ms, last_tok_s_, mfu_text.c_str(),
                mem_text.c_str(), format_duration(eta_s_).c_str());
  if (!options_.writer) return line;

  const int every = std::max(1, options_.console_every);
  if (options_.console && (m.step % every == 0 || m.step == options_.total_steps)) {
    std::fprintf(options_.console, "%s\n", line.c_str());
    std::fflush(options_.console);
  }
  using ojson = nlohmann::ordered_json;
  ojson record = {{"type", "train"},
                 {"step", m.step},
                 {"loss", number_or_null(m.loss)},
                 {"lr", number_or_null(m.lr)},
                 {"norm", number_or_null(m.grad_norm)},
                 {"ms", number_or_null(m.step_ms)},
                 {"tokens", number_or_null(m.tokens)},
                 {"tok_s", number_or_null(last_tok_s_)},
                 {"mfu", mfu ? ojson(*mfu) : ojson(nullptr)},
                 {"mem_gib", m.mem_gib >= 0 ? ojson(m.mem_gib) : ojson(nullptr)}};
  write_line(record);
  return line;
}

void MetricsLogger::log_eval(int step, double val_loss) {
  if (!options_.writer) return;
  if (options_.console) {
    std::fprintf(options_.console, "step %d/%d | val loss %.4f\n", step, options_.total_steps, val_loss);
    std::fflush(options_.console);
  }
  write_line(nlohmann::ordered_json{{"type", "eval"}, {"step", step}, {"val_loss", number_or_null(val_loss)}});
}

double MemoryReport::estimate_error() const {
  if (run_bytes() == 0) return std::nan("");
  return (static_cast<double>(estimate_bytes) - static_cast<double>(run_bytes())) / static_cast<double>(run_bytes());
}

// A plan is within a few per cent of a run alone on its GPU; a measured peak this far above it usually holds another
// process's memory (two trainings sharing one GPU), which the console line then says.
constexpr double kSharedGpuHint = 0.25;

void MetricsLogger::log_memory(const MemoryReport& m, const std::string& at) {
  if (!options_.writer) return;
  auto gib = [](size_t bytes) { return static_cast<double>(bytes) / 1073741824.0; };
  const double error = m.estimate_error();
  if (options_.console) {
    std::fprintf(options_.console,
                 "memory after step %d (%s): peak %.2f GiB in use (cudaMemGetInfo), %.2f GiB of it allocated by the "
                 "run (%.2f GiB in use before it: CUDA context, NCCL, other processes) | estimate %.2f GiB, %s%s\n",
                 m.step, at == "end" ? "end of run" : "first step", gib(m.peak_bytes), gib(m.run_bytes()),
                 gib(m.before_run_bytes), gib(m.estimate_bytes),
                 std::isfinite(error) ? strformat("within %.1f%% of measured (%s by %.2f GiB)", 100.0 * std::fabs(error),
                                                  error >= 0 ? "over" : "under",
                                                  std::fabs(gib(m.estimate_bytes) - gib(m.run_bytes()))).c_str()
                                      : "nothing measured",
                 error < -kSharedGpuHint ? "; cudaMemGetInfo counts the whole GPU, so memory that another process took "
                                           "after this run started counts as this run's (nvidia-smi lists the "
                                           "processes)"
                                         : "");
    std::fflush(options_.console);
  }
  write_line(nlohmann::ordered_json{{"type", "memory"},
                                    {"step", m.step},
                                    {"at", at},
                                    {"source", "cudaMemGetInfo"},
                                    {"peak_bytes", m.peak_bytes},
                                    {"before_run_bytes", m.before_run_bytes},
                                    {"run_bytes", m.run_bytes()},
                                    {"estimate_bytes", m.estimate_bytes},
                                    {"estimate_error", number_or_null(error)}});
}

void MetricsLogger::log_sample(int step, const std::string& text) {
  if (!options_.writer) return;
  if (options_.console) {
    std::fprintf(options_.console, "step %d/%d | sample:\n%s\n", step, options_.total_steps, text.c_str());
    std::fflush(options_.console);
  }
  write_line(nlohmann::ordered_json{{"type", "sample"}, {"step", step}, {"text", text}});
}

void MetricsLogger::log_record(const json& record) {
  if (!record.is_object() || !record.contains("type") || !record["type"].is_string())
    throw_error("metrics: a JSONL record must be an object with a string \"type\" (got %s)",
                record.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  if (!options_.writer) return;
  write_line(record);
}

double MetricsLogger::tokens_per_second() const {
  if (ema_samples_ == 0) return last_tok_s_;
  return ema_tok_s_ / (1.0 - std::pow(kEmaBeta, ema_samples_));
}

double MetricsLogger::eta_seconds() const { return eta_s_; }

}  // namespace llmc
