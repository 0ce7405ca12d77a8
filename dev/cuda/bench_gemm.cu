// dev/cuda/bench_gemm.cu: TFLOP/s of the three cuBLASLt products of llmc/gemm.h (forward, dgrad, wgrad) for every
// linear layer of GPT-2 124M and 350M at M = B*T = 16384, 32768, 65536 rows, after a spot check of sampled output
// elements against the FP64 CPU reference. Timing: cudaEvents around `iters` back-to-back calls after warm-up.
//
//   ./build/dev/cuda/bench_gemm [iters]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "llmc/common.h"
#include "llmc/gemm.h"

using namespace llmc;

namespace {

struct Linear {
  const char* name;
  int N, K;  // weight (N, K): out_features, in_features
};

// Device buffers are filled by tiling one random pattern (a prime number of elements, so rows do not repeat in
// step); the host reads the pattern to compute reference values without holding the multi-GB matrices.
struct Pattern {
  static constexpr size_t kSize = 1048573;  // prime
  std::vector<bf16> bits;
  std::vector<float> values;
  explicit Pattern(uint32_t seed) : bits(kSize), values(kSize) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (size_t i = 0; i < kSize; i++) {
      bits[i] = __float2bfloat16(dist(rng));
      values[i] = __bfloat162float(bits[i]);
    }
  }
  float at(size_t i) const { return values[i % kSize]; }
  bf16* upload(size_t n) const {
    bf16* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(bf16)));
    for (size_t off = 0; off < n; off += kSize) {
      const size_t count = std::min(kSize, n - off);
      CUDA_CHECK(cudaMemcpy(d + off, bits.data(), count * sizeof(bf16), cudaMemcpyHostToDevice));
    }
    return d;
  }
};

// Spot check: 32 sampled output elements of the forward product against an FP64 dot product.
bool spot_check_forward(const bf16* d_out, const Pattern& inp, const Pattern& w, int M, int N, int K) {
  std::mt19937 rng(5);
  for (int s = 0; s < 32; s++) {
    const int i = rng() % M, j = rng() % N;
    double ref = 0, absref = 0;
    for (int k = 0; k < K; k++) {
      const double prod = (double)inp.at((size_t)i * K + k) * w.at((size_t)j * K + k);
      ref += prod;
      absref += std::fabs(prod);
    }
    bf16 got_bf;
    CUDA_CHECK(cudaMemcpy(&got_bf, d_out + (size_t)i * N + j, sizeof(bf16), cudaMemcpyDeviceToHost));
    const double got = __bfloat162float(got_bf);
    if (std::fabs(got - ref) > std::fabs(ref) / 256.0 + 1e-5 * absref) {
      std::printf("MISMATCH at (%d, %d): got %f expected %f\n", i, j, got, ref);
      return false;
    }
  }
  return true;
}

template <typename F>
double time_ms(F&& fn, int iters) {
  for (int i = 0; i < 3; i++) fn();  // warm-up (also selects and caches the algorithm)
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < iters; i++) fn();
  CUDA_CHECK(cudaEventRecord(stop));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms / iters;
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("bench_gemm: no CUDA GPU on this machine\n");
    return 1;
  }
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  std::printf("device: %s, iters %d\n", cuda_device_name().c_str(), iters);
  gemm_init();
  struct Model {
    const char* name;
    int C;
  };
  const Model models[] = {{"gpt2-124m", 768}, {"gpt2-350m", 1024}};
  const int Ms[] = {16384, 32768, 65536};
  const int Vp = 50304;
  bool all_ok = true;
  const Pattern pat_inp(1), pat_w(2), pat_dout(3);
  std::printf("%-10s %-8s %6s %6s %6s %10s %10s %10s\n", "model", "layer", "M", "N", "K", "fwd TF/s", "dgrad TF/s",
              "wgrad TF/s");
  for (const Model& m : models) {
    const int C = m.C;
    const Linear layers[] = {{"qkv", 3 * C, C}, {"attproj", C, C}, {"fc", 4 * C, C}, {"fcproj", C, 4 * C},
                             {"lm_head", Vp, C}};
    for (int M : Ms) {
      for (const Linear& L : layers) {
        bf16* inp = pat_inp.upload((size_t)M * L.K);     // (M, K)
        bf16* w = pat_w.upload((size_t)L.N * L.K);       // (N, K)
        bf16* dout = pat_dout.upload((size_t)M * L.N);   // (M, N)
        bf16 *out = nullptr, *dinp = nullptr;
        float* dw = nullptr;
        CUDA_CHECK(cudaMalloc(&out, (size_t)M * L.N * sizeof(bf16)));   // (M, N)
        CUDA_CHECK(cudaMalloc(&dinp, (size_t)M * L.K * sizeof(bf16)));  // (M, K)
        CUDA_CHECK(cudaMalloc(&dw, (size_t)L.N * L.K * sizeof(float)));  // (N, K)
        CUDA_CHECK(cudaMemset(dw, 0, (size_t)L.N * L.K * sizeof(float)));

        matmul_forward(out, inp, w, nullptr, M, L.N, L.K, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const bool ok = spot_check_forward(out, pat_inp, pat_w, M, L.N, L.K);
        all_ok &= ok;

        const double flops = 2.0 * M * L.N * L.K;
        const double t_fwd = time_ms([&] { matmul_forward(out, inp, w, nullptr, M, L.N, L.K, 0); }, iters);
        const double t_dgrad = time_ms([&] { matmul_dgrad(dinp, dout, w, M, L.N, L.K, false, 0); }, iters);
        const double t_wgrad = time_ms([&] { matmul_wgrad(dw, dout, inp, M, L.N, L.K, true, 0); }, iters);
        std::printf("%-10s %-8s %6d %6d %6d %10.1f %10.1f %10.1f%s\n", m.name, L.name, M, L.N, L.K,
                    flops / t_fwd * 1e-9, flops / t_dgrad * 1e-9, flops / t_wgrad * 1e-9, ok ? "" : "  WRONG");
        cudaFree(inp);
        cudaFree(w);
        cudaFree(dout);
        cudaFree(out);
        cudaFree(dinp);
        cudaFree(dw);
      }
    }
  }
  gemm_shutdown();
  std::printf(all_ok ? "all spot checks passed\n" : "SPOT CHECK FAILED\n");
  return all_ok ? 0 : 1;
}
