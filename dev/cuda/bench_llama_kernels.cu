// dev/cuda/bench_llama_kernels: times the Llama kernels (llmc/kernels/rmsnorm.cu, rope.cu, swiglu.cu) at Llama-3.2-1B shapes
// (B=4, T=2048, C=2048, 32 query / 8 key-value heads of 64, F=8192), each without and with its amax output: warm-up,
// then the median of repeated cudaEvent timings; prints ms and GB/s with bytes = every input read once + every output
// written once (the ideal traffic of a memory-bound kernel). Correctness is the job of test/kernels/test_llama_kernels.
// Usage: bench_llama_kernels [repeats]   (default 20)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/kernels/rmsnorm.h"
#include "llmc/kernels/rope.h"
#include "llmc/kernels/swiglu.h"

using llmc::bf16;

namespace {

constexpr int B = 4, T = 2048, C = 2048, NH = 32, NKV = 8, HS = 64, F = 8192;
constexpr int N = B * T;
constexpr int Q = (NH + 2 * NKV) * HS;  // fused q|k|v width
constexpr size_t kBf16 = sizeof(bf16), kF32 = sizeof(float);

std::vector<void*> g_allocations;

template <class T>
T* device_alloc(size_t n) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, n * sizeof(T)));
  g_allocations.push_back(d);
  return d;
}

template <class T>
T* device_random(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> host(n);
  for (T& x : host) x = T(dist(rng));
  T* d = device_alloc<T>(n);
  CUDA_CHECK(cudaMemcpy(d, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

int g_repeats = 20;

double time_ms(const std::function<void()>& launch) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < 3 + g_repeats; i++) {
    CUDA_CHECK(cudaEventRecord(start));
    launch();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) times.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void report(const char* name, double ms, double bytes) {
  std::printf("%-44s %9.4f ms %9.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_repeats = std::max(1, std::atoi(argv[1]));
  if (llmc::cuda_device_count() == 0) {
    std::printf("bench_llama_kernels: no CUDA GPU on this machine\n");
    return 1;
  }
  std::printf("bench_llama_kernels on %s: B=%d T=%d C=%d NH=%d NKV=%d HS=%d F=%d, median of %d\n",
              llmc::cuda_device_name().c_str(), B, T, C, NH, NKV, HS, F, g_repeats);
  std::mt19937 rng(42);
  const size_t NC = static_cast<size_t>(N) * C;
  float* amax = device_alloc<float>(1);
  CUDA_CHECK(cudaMemset(amax, 0, sizeof(float)));

  // RMSNorm (N, C)
  bf16* act = device_random<bf16>(NC, rng);
  bf16* act2 = device_random<bf16>(NC, rng);
  bf16* out = device_random<bf16>(NC, rng);
  bf16* residual = device_random<bf16>(NC, rng);
  bf16* weight = device_random<bf16>(C, rng, 0.5f, 1.5f);
  float* rstd = device_random<float>(N, rng, 0.5f, 2.0f);
  for (float* a : {static_cast<float*>(nullptr), amax}) {
    const char* tag = a ? " +amax" : "";
    char name[96];
    std::snprintf(name, sizeof(name), "rmsnorm_forward%s", tag);
    report(name, time_ms([&] { llmc::rmsnorm_forward(out, rstd, act, weight, N, C, 1e-5f, 0, a); }),
           NC * kBf16 * 2 + N * kF32);
    std::snprintf(name, sizeof(name), "fused_residual_rmsnorm_forward%s", tag);
    report(name, time_ms([&] {
             llmc::fused_residual_rmsnorm_forward(residual, out, rstd, act, act2, weight, N, C, 1e-5f, 0, a);
           }),
           NC * kBf16 * 4 + N * kF32);
  }
  float* dweight = device_random<float>(C, rng);
  float* scratch = device_alloc<float>(llmc::rmsnorm_backward_scratch_floats(N, C));
  for (float* a : {static_cast<float*>(nullptr), amax})
    report(a ? "rmsnorm_backward +amax" : "rmsnorm_backward", time_ms([&] {
             llmc::rmsnorm_backward(out, dweight, scratch, act, act2, weight, rstd, N, C, 0, a);
           }),
           NC * kBf16 * 4 + N * kF32);  // dout, inp, dinp read + dinp written

  // RoPE on the packed qkv (N, Q): q and k heads read and written in place; +amax also reads the value heads.
  bf16* qkv = device_random<bf16>(static_cast<size_t>(N) * Q, rng);
  const double qk_bytes = 2.0 * N * (NH + NKV) * HS * kBf16;
  report("rope_forward", time_ms([&] { llmc::rope_forward(qkv, B, T, NH, NKV, HS, 500000.0f, 0); }), qk_bytes);
  report("rope_backward", time_ms([&] { llmc::rope_backward(qkv, B, T, NH, NKV, HS, 500000.0f, 0); }), qk_bytes);
  report("rope_backward +amax", time_ms([&] { llmc::rope_backward(qkv, B, T, NH, NKV, HS, 500000.0f, 0, amax); }),
         qk_bytes + 1.0 * N * NKV * HS * kBf16);

  // SwiGLU: gate_up (N, 2F) -> (N, F)
  bf16* gate_up = device_random<bf16>(static_cast<size_t>(N) * 2 * F, rng, -4.0f, 4.0f);
  bf16* hidden = device_random<bf16>(static_cast<size_t>(N) * F, rng);
  bf16* dgate_up = device_random<bf16>(static_cast<size_t>(N) * 2 * F, rng);
  const double NF = static_cast<double>(N) * F;
  for (float* a : {static_cast<float*>(nullptr), amax}) {
    report(a ? "swiglu_forward +amax" : "swiglu_forward",
           time_ms([&] { llmc::swiglu_forward(hidden, gate_up, N, F, 0, a); }), 3.0 * NF * kBf16);
    report(a ? "swiglu_backward +amax" : "swiglu_backward",
           time_ms([&] { llmc::swiglu_backward(dgate_up, hidden, gate_up, N, F, 0, a); }), 5.0 * NF * kBf16);
  }

  CUDA_CHECK(cudaDeviceSynchronize());
  for (void* p : g_allocations) CUDA_CHECK(cudaFree(p));
  return 0;
}
