// llmc/core/common.h: error checks for CUDA / cuBLAS / NCCL with file:line and a hint, the fatal-error path every module
// uses, device queries, and small utilities. Host code only needs the CUDA runtime headers, so this compiles on a
// machine without a GPU.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

namespace llmc {

// Every user-facing error (bad config, bad shard, bad checkpoint) is thrown as llmc::Error with a message that names
// the problem and, where possible, how to fix it. train_gpt catches it, prints "error: <message>" and exits with 1.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// printf-style message formatting into a std::string.
std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void throw_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Internal failures (CUDA, cuBLAS, NCCL): printed with file:line and thrown as llmc::Error.
[[noreturn]] void cuda_fail(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void cublas_fail(int status, const char* expr, const char* file, int line);
[[noreturn]] void nccl_fail(int result, const char* expr, const char* file, int line);

// Number of CUDA devices usable by this process; 0 when there is no driver or no GPU (never throws).
int cuda_device_count();

// "NVIDIA H100 80GB HBM3" etc.; empty when there is no GPU.
std::string cuda_device_name(int device = 0);

// The value among `values` whose name_of(value) is s: true with *out set, or false (out untouched). For the
// parse_* functions of small named enumerations.
template <typename T, size_t N, typename NameOf>
bool find_by_name(const std::string& s, const T (&values)[N], NameOf name_of, T* out) {
  for (const T& v : values)
    if (s == name_of(v)) {
      *out = v;
      return true;
    }
  return false;
}

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
inline size_t round_up(size_t a, size_t b) { return ceil_div(a, b) * b; }

}  // namespace llmc

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t err_ = (expr);                                                        \
    if (err_ != cudaSuccess) ::llmc::cuda_fail(err_, #expr, __FILE__, __LINE__);      \
  } while (0)

// After a kernel launch: catches launch-configuration errors immediately (asynchronous faults surface later).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(expr)                                                            \
  do {                                                                                \
    int st_ = static_cast<int>(expr);                                                 \
    if (st_ != 0) ::llmc::cublas_fail(st_, #expr, __FILE__, __LINE__);               \
  } while (0)

#define NCCL_CHECK(expr)                                                              \
  do {                                                                                \
    int r_ = static_cast<int>(expr);                                                  \
    if (r_ != 0) ::llmc::nccl_fail(r_, #expr, __FILE__, __LINE__);                    \
  } while (0)
