// test/support/finite_diff.h: what the CPU tests of the kernel references (test/kernels/test_kernel_refs.cpp,
// test_llama_kernel_refs.cpp, test_attention_ref.cpp) use to check a backward reference against central finite
// differences of its forward. The FP32 references compute in FP64 and round to FP32 at the end, so for a loss of
// O(10) the rounding noise is ~1e-6, the difference quotient's error ~1e-6 / (2h) = 5e-5 and the truncation
// ~h^2 = 1e-4: kFdTolerance = 2e-3 for h = kFdStep = 1e-2. (FP64 references pass their own, smaller step.)
#pragma once

#include <cstddef>
#include <random>
#include <vector>

namespace llmc_test {

constexpr float kFdStep = 1e-2f;
constexpr double kFdTolerance = 2e-3;

// n values uniform in [lo, hi) from rng.
inline std::vector<float> random_vector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// sum a[i] * b[i] in FP64 (a linear loss of an output against fixed weights b).
inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); i++) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// d loss / d param[i] by central differences with the given step (FP32 references: kFdStep), loss() reading param
// (restored afterwards).
template <class T, class Loss>
double finite_difference(std::vector<T>& param, size_t i, Loss loss, T step = static_cast<T>(kFdStep)) {
  const T saved = param[i];
  param[i] = saved + step;
  const double plus = loss();
  param[i] = saved - step;
  const double minus = loss();
  param[i] = saved;
  return (plus - minus) / (2.0 * static_cast<double>(step));
}

}  // namespace llmc_test
