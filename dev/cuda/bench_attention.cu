// dev/cuda/bench_attention.cu: times the flash attention forward and backward (llmc/kernels/attention.cu) on GPT-2-like
// shapes and prints ms and TFLOP/s (causal FLOPs: forward 2*2*B*NH*T*T*HS/2, backward 2.5x forward), for the portable
// mma.sync kernels and, where the default differs (head size 64 on Hopper), for the default (wgmma) kernels.
// Before timing each shape, a B=1 slice of it (one kv group) is checked against the CPU reference.
// Usage: bench_attention [reps] [shape]   (default 50 timed repetitions after 5 warm-ups, the median reported; every
//        shape, or only those whose name contains `shape`)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/kernels/attention.h"
#include "test/reference/kernels_ref.h"

using llmc::bf16;

struct Shape {
  const char* name;
  int B, T, NH, NKV, HS;
};

// Deterministic pseudo-random bf16 fill on the device: normal-ish values with the given stddev (sum of 4 uniforms).
__global__ void fill_random_kernel(bf16* out, size_t n, float stddev, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 0x9E3779B9u ^ seed;
    float sum = 0.f;
    for (int j = 0; j < 4; j++) {
      x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16;
      sum += (float)(x >> 8) * (1.f / 16777216.f) - 0.5f;  // uniform(-0.5, 0.5): variance 1/12
    }
    out[i] = __float2bfloat16(sum * stddev * 1.7320508f);  // 4 uniforms: variance 1/3 -> scale to stddev
  }
}

void fill_random(bf16* out, size_t n, float stddev, uint32_t seed) {
  fill_random_kernel<<<1024, 256>>>(out, n, stddev, seed);
  CUDA_CHECK_LAUNCH();
}

template <typename F>
float median_ms(F&& launch, int reps) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 5; i++) launch();  // warm-up
  std::vector<float> times;
  for (int i = 0; i < reps; i++) {
    CUDA_CHECK(cudaEventRecord(start));
    launch();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<float> download_float(const bf16* d, size_t n) {
  std::vector<bf16> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
  return f;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < a.size(); i++) {
    d2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    r2 += (double)b[i] * b[i];
  }
  return std::sqrt(d2 / r2);  // NaN propagates: an unwritten (poisoned) element shows up as nan
}

// Forward and backward of one B=1 kv group of the shape against the CPU reference (rel-norm errors printed).
void check_slice(const Shape& s) {
  const int B = 1, NH = s.NH / s.NKV, NKV = 1;
  const size_t qkv_n = (size_t)B * s.T * (NH + 2 * NKV) * s.HS, out_n = (size_t)B * s.T * NH * s.HS;
  const size_t lse_n = (size_t)B * NH * s.T;
  bf16 *qkv, *out, *dout, *dqkv;
  float *lse, *scratch;
  CUDA_CHECK(cudaMalloc(&qkv, qkv_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&dqkv, qkv_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&out, out_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&dout, out_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&lse, lse_n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&scratch, llmc::attention_backward_scratch_floats(B, s.T, NH, s.HS) * sizeof(float)));
  fill_random(qkv, qkv_n, 1.5f, 11);
  fill_random(dout, out_n, 1.0f, 12);
  CUDA_CHECK(cudaMemset(out, 0xFF, out_n * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(dqkv, 0xFF, qkv_n * sizeof(bf16)));
  llmc::attention_forward(out, lse, qkv, B, s.T, NH, NKV, s.HS, 0);
  llmc::attention_backward(dqkv, scratch, dout, qkv, out, lse, B, s.T, NH, NKV, s.HS, 0);
  CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<float> qkv_h = download_float(qkv, qkv_n), dout_h = download_float(dout, out_n);
  const std::vector<float> out_gpu = download_float(out, out_n), dqkv_gpu = download_float(dqkv, qkv_n);
  std::vector<float> lse_gpu(lse_n), out_ref(out_n), lse_ref(lse_n), dqkv_ref(qkv_n);
  CUDA_CHECK(cudaMemcpy(lse_gpu.data(), lse, lse_n * sizeof(float), cudaMemcpyDeviceToHost));
  llmc::attention_forward_cpu(out_ref.data(), lse_ref.data(), qkv_h.data(), B, s.T, NH, NKV, s.HS);
  llmc::attention_backward_cpu(dqkv_ref.data(), dout_h.data(), qkv_h.data(), out_gpu.data(), lse_gpu.data(), B, s.T,
                               NH, NKV, s.HS);
  const double out_err = rel_err(out_gpu, out_ref), dqkv_err = rel_err(dqkv_gpu, dqkv_ref);
  std::printf("  check (B=1, NH=%d, NKV=1): out rel err %.2e, dqkv rel err %.2e %s\n", NH, out_err, dqkv_err,
              out_err < 1e-2 && dqkv_err < 2e-2 ? "OK" : "MISMATCH");
  cudaFree(qkv); cudaFree(dqkv); cudaFree(out); cudaFree(dout); cudaFree(lse); cudaFree(scratch);
}

// Checks and times one shape with the currently selected attention kernels.
void bench_shape(const Shape& s, int reps) {
  std::printf("%s: B=%d T=%d NH=%d NKV=%d HS=%d, %s kernels\n", s.name, s.B, s.T, s.NH, s.NKV, s.HS,
              llmc::attention_kernels_name(s.HS));
  check_slice(s);
  const size_t qkv_n = (size_t)s.B * s.T * (s.NH + 2 * s.NKV) * s.HS, out_n = (size_t)s.B * s.T * s.NH * s.HS;
  bf16 *qkv, *out, *dout, *dqkv;
  float *lse, *scratch;
  CUDA_CHECK(cudaMalloc(&qkv, qkv_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&dqkv, qkv_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&out, out_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&dout, out_n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&lse, (size_t)s.B * s.NH * s.T * sizeof(float)));
  CUDA_CHECK(
      cudaMalloc(&scratch, llmc::attention_backward_scratch_floats(s.B, s.T, s.NH, s.HS) * sizeof(float)));
  fill_random(qkv, qkv_n, 1.0f, 1);
  fill_random(dout, out_n, 1.0f, 2);

  const double fwd_flops = 2.0 * 2.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;
  const double bwd_flops = 2.5 * fwd_flops;
  const float fwd_ms = median_ms([&] { llmc::attention_forward(out, lse, qkv, s.B, s.T, s.NH, s.NKV, s.HS, 0); },
                                 reps);
  const float bwd_ms = median_ms(
      [&] {
        llmc::attention_backward(dqkv, scratch, dout, qkv, out, lse, s.B, s.T, s.NH, s.NKV, s.HS, 0);
      },
      reps);
  std::printf("  forward  %8.3f ms  %6.1f TFLOP/s\n", fwd_ms, fwd_flops / (fwd_ms * 1e-3) / 1e12);
  std::printf("  backward %8.3f ms  %6.1f TFLOP/s\n", bwd_ms, bwd_flops / (bwd_ms * 1e-3) / 1e12);
  cudaFree(qkv); cudaFree(dqkv); cudaFree(out); cudaFree(dout); cudaFree(lse); cudaFree(scratch);
}

int main(int argc, char** argv) {
  if (llmc::cuda_device_count() == 0) {
    std::printf("bench_attention: no CUDA GPU on this machine\n");
    return 1;
  }
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  std::printf("bench_attention on %s, median of %d reps\n", llmc::cuda_device_name().c_str(), reps);
  const Shape shapes[] = {
      {"gpt2-124M", 16, 1024, 12, 12, 64},
      {"gpt2-124M-b32", 32, 1024, 12, 12, 64},
      {"gpt2-350M", 8, 1024, 16, 16, 64},
      {"hs128-gqa8", 4, 2048, 16, 8, 128},
  };
  const std::string only = argc > 2 ? argv[2] : "";
  for (const Shape& s : shapes) {
    if (std::string(s.name).find(only) == std::string::npos) continue;
    for (llmc::AttentionKernels kernels : {llmc::AttentionKernels::kPortable, llmc::AttentionKernels::kAuto}) {
      llmc::set_attention_kernels(kernels);
      if (kernels == llmc::AttentionKernels::kAuto && std::string(llmc::attention_kernels_name(s.HS)) == "mma.sync")
        continue;  // the default kernels are the portable ones, timed already
      bench_shape(s, reps);
    }
  }
  llmc::set_attention_kernels(llmc::AttentionKernels::kAuto);
  return 0;
}
