// test/support/gpu_test_util.cuh: helpers shared by the kernel tests (test_kernels.cu, test_llama_kernels.cu): the per-run
// seed (printed; LLM8_TEST_SEED replays it) and per-test generators, random bf16-representable inputs, device buffers
// that can be poisoned with NaN, zeroed amax slots, element-wise comparisons that report the first mismatches, and the
// standard tolerances (bf16 rounding, FP32 column sums). Header-only; every function is inline.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/kernels/conventions.h"
#include "llmc/kernels/reduce.h"

namespace gpu_test {

using llmc::bf16;

constexpr double kBf16Rtol = 1.0 / 256.0;    // 2^-8: bf16 unit roundoff (half an ulp, 8 significant bits)
constexpr double kFp32Eps = 1.0 / 16777216;  // 2^-24: FP32 unit roundoff

// ---------------------------------------------------------------------------------------------------------------
// Seed and random inputs
inline uint64_t run_seed(const char* program) {
  static const uint64_t seed = [program] {
    const char* env = std::getenv("LLM8_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("%s: seed %llu (replay with LLM8_TEST_SEED=%llu)\n", program, static_cast<unsigned long long>(s),
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// A generator per test, derived from the run seed and the test's full name (tests stay independent of their order).
inline std::mt19937_64 make_rng(const char* program) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  return std::mt19937_64(run_seed(program) ^ std::hash<std::string>{}(name));
}

inline std::vector<float> random_floats(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Random values already representable in bf16 (so host and device see the same inputs).
inline std::vector<float> random_bf16_values(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::vector<float> v = random_floats(n, rng, lo, hi);
  for (float& x : v) x = round_bf16(x);
  return v;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = __float2bfloat16_rn(v[i]);
  return out;
}
inline std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = __bfloat162float(v[i]);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Device buffers
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bits set: NaN in both bf16 and FP32, so any element a kernel fails to write shows up.
  void poison() { CUDA_CHECK(cudaMemset(ptr, 0xff, n * sizeof(T))); }
  void fill_value(T value) { upload(std::vector<T>(n, value)); }
};

inline DeviceBuffer<bf16> upload_bf16(const std::vector<float>& v) { return DeviceBuffer<bf16>(to_bf16(v)); }
inline std::vector<float> download_bf16(const DeviceBuffer<bf16>& d) { return to_float(d.download()); }

// A zeroed device amax slot (one float), as the FP8 linears hand to the kernels that produce their operands. value()
// waits for the device and reads the slot.
struct AmaxSlot {
  float* ptr = nullptr;
  AmaxSlot() {
    CUDA_CHECK(cudaMalloc(&ptr, sizeof(float)));
    CUDA_CHECK(cudaMemset(ptr, 0, sizeof(float)));
  }
  AmaxSlot(const AmaxSlot&) = delete;
  AmaxSlot& operator=(const AmaxSlot&) = delete;
  ~AmaxSlot() { cudaFree(ptr); }
  float value() const {
    float v = -1.0f;
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(&v, ptr, sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Comparisons
// Every element must satisfy |got - want| <= tol[i] (NaN fails). Reports the count and the first few failures with
// their index.
inline ::testing::AssertionResult within(const char* what, const std::vector<float>& got,
                                         const std::vector<float>& want, const std::vector<double>& tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size mismatch " << got.size() << " vs " << want.size();
  size_t bad = 0;
  std::string report;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const bool ok = err <= tol[i];  // false for NaN
    if (!ok && bad++ < 6)
      report += llmc::strformat("\n  [%zu] got %.9g want %.9g (tol %.3g)", i, got[i], want[i], tol[i]);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size() << " out of tolerance"
                                       << report;
}

// Tolerance for a bf16 output: (2^-8 + rel) |ref| + atol (rel: the relative FP32 noise of the GPU arithmetic before
// the final rounding, which can push a value across a rounding boundary; atol: results near zero).
inline std::vector<double> bf16_tolerance(const std::vector<float>& ref, double atol, double rel = 0.0) {
  std::vector<double> tol(ref.size());
  for (size_t i = 0; i < ref.size(); i++) tol[i] = (kBf16Rtol + rel) * std::fabs(ref[i]) + atol;
  return tol;
}

// Tolerance for an FP32 sum: 2 * depth * 2^-24 * abs_sum[i], abs_sum = sum of |terms| (including the pre-fill).
inline std::vector<double> fp32_sum_tolerance(const std::vector<float>& abs_sum, double depth) {
  std::vector<double> tol(abs_sum.size());
  for (size_t i = 0; i < abs_sum.size(); i++) tol[i] = 2.0 * depth * kFp32Eps * abs_sum[i] + 1e-30;
  return tol;
}

// Longest addition chain in the two-stage column sums of N rows (llmc/core/cuda_utils.cuh sum_column_partials): 32 rows
// per chunk, chunks spread over 32 lanes, 32 lane sums, then the += into the gradient.
inline double column_sum_depth(int N) { return 32 + std::ceil(std::ceil(N / 32.0) / 32.0) + 32 + 1; }

// The same bits, or both NaN: a NaN's payload is no kernel's contract (the device's canonical NaN is 0x7fffffff, a
// widened bf16 NaN 0x7fff0000, the host's 0x7fc00000), every other value must match bit for bit.
template <class T>
bool same_bits_or_both_nan(const T& a, const T& b) {
  if (std::memcmp(&a, &b, sizeof(T)) == 0) return true;
  if constexpr (std::is_floating_point_v<T>) return std::isnan(a) && std::isnan(b);
  return false;
}

template <class T>
::testing::AssertionResult bitwise_equal(const char* what, const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < a.size(); i++)
    if (!same_bits_or_both_nan(a[i], b[i]))
      return ::testing::AssertionFailure() << what << ": first difference at element " << i;
  return ::testing::AssertionSuccess();
}

inline std::vector<float> absolute(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// max |v| (NaN-propagating like the kernels' amax: a NaN gives NaN).
inline float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) {
    if (std::isnan(x)) return x;
    m = std::max(m, std::fabs(x));
  }
  return m;
}

// The amax slot must hold exactly `want` (bit for bit: both are maxima of the same bf16 values).
inline ::testing::AssertionResult amax_equals(const char* what, float got, float want) {
  if (std::memcmp(&got, &want, sizeof(float)) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": amax slot holds " << llmc::strformat("%.9g", got)
                                       << " but max |output| is " << llmc::strformat("%.9g", want);
}

}  // namespace gpu_test
