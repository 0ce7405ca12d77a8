// llmc/run/metrics.h: GPU peak-throughput table for MFU, duration formatting, and the MetricsLogger that prints the
// per-step console line and appends JSONL records (one JSON object per line, flushed per line).
//
// Console line (every `console_every` steps and at the last step):
//   step 120/5000 | loss 3.2154 | lr 5.98e-04 | norm 0.812 | 312.4 ms | 418234 tok/s | MFU 41.3% | mem 38.2 GiB | ETA 25m24s
// tok/s is an exponential moving average (beta 0.95) of the per-step throughput, bias-corrected, that skips the first
// step logged after a (re)start (it includes warm-up work); ETA = remaining steps x tokens per step / that tok/s.
// MFU = flops_per_token x tok/s / (peak TFLOPS x 1e12 x world size); unknown peak → "MFU n/a", never negative.
//
// JSONL records (keys in this order; null where a value is unknown or not finite):
//   {"type":"train","step":120,"loss":3.2154,"lr":0.000598,"norm":0.812,"ms":312.4,"tokens":131072,
//    "tok_s":418234.0,"mfu":41.3,"mem_gib":38.2}
//   {"type":"eval","step":250,"val_loss":3.31}
//   {"type":"memory","step":1,"at":"first_step","source":"cudaMemGetInfo","peak_bytes":...,"before_run_bytes":...,
//    "run_bytes":...,"estimate_bytes":...,"estimate_error":-0.012}   (log_memory: after the first step and at the end)
//   {"type":"sample","step":250,"text":"..."}          (invalid UTF-8 in the text is replaced by U+FFFD)
//   any other record through log_record (e.g. {"type":"telemetry",...} or {"type":"resume","step":200})
// The file is never truncated: a fresh run rotates an existing non-empty log to <file>.1 (the first free <file>.K, so
// .1 is the oldest), and a run resuming from the checkpoint of step S moves the records written after that checkpoint
// (from the first record whose "step" exceeds S, or a partial last line, to the end) to <file>.after-step-S (the
// first free name: .after-step-S.2, ...) and appends, so the log holds each step once. Every write and flush is
// checked, and so is the file itself (removed or replaced while the run writes it): a failure is an llmc::Error naming
// the file, which stops the run rather than losing records. Only regular files are rotated or split (a device such as
// /dev/null is written as is). Only the writer (rank 0) prints or writes anything; on other ranks every call is a
// no-op apart from the throughput bookkeeping.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include <sys/types.h>

#include <nlohmann/json.hpp>

namespace llmc {

// Dense (no sparsity) peak tensor throughput of one GPU, in TFLOPS. fp8_tflops = 0 where the GPU has no FP8.
struct GpuPeaks {
  double bf16_tflops, fp8_tflops;
};

// Case-insensitive match of a CUDA device name ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200",
// "NVIDIA A100-SXM4-80GB", "NVIDIA B200", "NVIDIA GH200 480GB", ...). Unknown → false, *peaks untouched.
bool gpu_peaks(const std::string& device_name, GpuPeaks* peaks);

// Model FLOPs utilisation in percent; nullopt when any input is unknown (<= 0 or not finite).
std::optional<double> mfu_percent(double flops_per_token, double tokens_per_second, double peak_tflops_per_gpu,
                                  int num_gpus);

// "42s", "3m05s", "1h02m", "2d03h"; "n/a" for negative, NaN or infinite durations.
std::string format_duration(double seconds);

struct MetricsOptions {
  bool writer = true;             // rank 0: only it prints and writes
  std::string jsonl_path = "";    // "" = no JSONL file; parent directories are created
  int resume_step = -1;           // >= 0: resuming from the checkpoint of this step (see above); < 0: a fresh run
  int total_steps = 0;            // for "step i/N" and the ETA
  int console_every = 1;          // console line every N steps (and at the last step)
  double flops_per_token = 0;     // model FLOPs per token (6N + 6LCT); 0 = no MFU
  double peak_tflops = 0;         // dense peak of one GPU for the recipe's GEMM format; 0 = unknown → "MFU n/a"
  int world_size = 1;             // GPUs sharing the work (MFU denominator)
  FILE* console = stdout;         // where the console lines go
};

struct TrainStepMetrics {
  int step = 0;                   // 1-based number of the step just completed (1..total_steps)
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;             // wall time of the step
  double tokens = 0;              // tokens processed by the step over all ranks
  double mem_gib = -1;            // peak device memory of this rank; < 0 = unknown
};

// A rank's device memory measured against the memory plan's estimate (llmc/run/memory_plan.h). Measured with
// cudaMemGetInfo (total - free: the whole GPU, other processes included) at the end of every step: every buffer of a
// run is allocated by the end of its first step and kept, so the peak is reached there.
struct MemoryReport {
  int step = 0;                 // measured up to the end of this step
  size_t peak_bytes = 0;        // the most device memory in use seen at the end of a step
  size_t before_run_bytes = 0;  // in use before the run allocated anything (CUDA context, NCCL, other processes)
  size_t estimate_bytes = 0;    // the memory plan's total
  size_t run_bytes() const { return peak_bytes > before_run_bytes ? peak_bytes - before_run_bytes : 0; }
  // (estimate - run_bytes) / run_bytes: what the plan is compared with; NaN when nothing was measured.
  double estimate_error() const;
};

class MetricsLogger {
 public:
  explicit MetricsLogger(const MetricsOptions& options);  // llmc::Error naming log.jsonl if the file cannot be opened
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Updates the throughput average, prints the console line when due, writes a "train" record; returns the line.
  std::string log_train(const TrainStepMetrics& m);
  void log_eval(int step, double val_loss);
  void log_sample(int step, const std::string& text);
  // The console line "memory after step S (at): peak ... | estimate ... within X% of measured" and a "memory"
  // record; at: "first_step" or "end" (the console says "first step" / "end of run").
  void log_memory(const MemoryReport& m, const std::string& at);
  void log_record(const nlohmann::json& record);  // any object with a string "type"; llmc::Error otherwise

  double tokens_per_second() const;  // the bias-corrected average; 0 before any step
  double eta_seconds() const;        // after the last log_train; < 0 when unknown

 private:
  template <class Json>
  void write_line(const Json& record);
  void prepare_file();  // rotation (fresh run) or the records after the checkpoint moved aside (resume)
  void say(const std::string& message) const;  // a "metrics: ..." console line (writer only)
  MetricsOptions options_;
  FILE* jsonl_ = nullptr;
  dev_t jsonl_dev_ = 0;         // the file opened (regular files): writes check it is still the one at jsonl_path
  ino_t jsonl_ino_ = 0;
  int steps_seen_ = 0;          // log_train calls since construction
  int ema_samples_ = 0;         // steps folded into the average (the first one is skipped)
  double ema_tok_s_ = 0;        // raw EMA (before bias correction)
  double last_tok_s_ = 0;       // tok/s shown by the last log_train
  double eta_s_ = -1;
};

}  // namespace llmc
