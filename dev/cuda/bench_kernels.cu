// dev/cuda/bench_kernels: times every kernel of llmc/kernels/ (but attention) and the AdamW update (FP32 and BF16
// moments) at GPT-2 124M shapes (B=16, T=1024, C=768, V=50257, Vp=50304): warm-up, then the median of repeated
// cudaEvent timings; prints ms and the achieved GB/s with bytes = every input read once + every output written once
// (the ideal traffic of a memory-bound kernel). Correctness is the job of test/kernels/test_kernels and
// test/optim/test_adamw; the inputs here are random but valid.
// Usage: bench_kernels [repeats]   (default 20)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/kernels/classifier.h"
#include "llmc/kernels/encoder.h"
#include "llmc/kernels/gelu.h"
#include "llmc/kernels/layernorm.h"
#include "llmc/kernels/reduce.h"
#include "llmc/optim/adamw_update.h"

using llmc::bf16;

namespace {

constexpr int B = 16, T = 1024, C = 768, V = 50257, Vp = 50304;
constexpr int N = B * T;
constexpr size_t kBf16 = sizeof(bf16), kF32 = sizeof(float);

std::vector<void*> g_allocations;  // freed at exit

template <class T>
T* device_alloc(size_t n) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, n * sizeof(T)));
  g_allocations.push_back(d);
  return d;
}

// Device array of n values uniform in [lo, hi] (bf16 or float).
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

// Median time in ms of `launch` over g_repeats timed runs after 3 warm-ups; `reset` (untimed) runs before each.
double time_ms(const std::function<void()>& launch, const std::function<void()>& reset = nullptr) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < 3 + g_repeats; i++) {
    if (reset) reset();
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
  std::printf("%-34s %9.4f ms %9.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_repeats = std::max(1, std::atoi(argv[1]));
  if (llmc::cuda_device_count() == 0) {
    std::printf("bench_kernels: no CUDA GPU on this machine\n");
    return 1;
  }
  std::printf("bench_kernels on %s: B=%d T=%d C=%d Vp=%d, median of %d\n", llmc::cuda_device_name().c_str(), B, T, C,
              Vp, g_repeats);
  std::mt19937 rng(42);
  const size_t NC = static_cast<size_t>(N) * C;

  // Embedding
  std::vector<int> host_tokens(N);
  std::uniform_int_distribution<int> token_dist(0, V - 1);
  for (int& t : host_tokens) t = token_dist(rng);
  int* tokens = device_alloc<int>(N);
  CUDA_CHECK(cudaMemcpy(tokens, host_tokens.data(), N * sizeof(int), cudaMemcpyHostToDevice));
  bf16* wte = device_random<bf16>(static_cast<size_t>(Vp) * C, rng);
  bf16* wpe = device_random<bf16>(static_cast<size_t>(T) * C, rng);
  bf16* act = device_random<bf16>(NC, rng);
  bf16* act2 = device_random<bf16>(NC, rng);
  bf16* out = device_random<bf16>(NC, rng);
  report("encoder_forward", time_ms([&] { llmc::encoder_forward(out, tokens, wte, wpe, B, T, C, 0); }),
         N * 4.0 + 2.0 * NC * kBf16 + NC * kBf16);  // token rows gathered once each (upper bound of wte traffic)

  float* dwte = device_random<float>(static_cast<size_t>(Vp) * C, rng);
  float* dwpe = device_random<float>(static_cast<size_t>(T) * C, rng);
  llmc::EncoderBackwardPlan plan;
  report("encoder_backward_plan_build (host)", time_ms([&] { plan.build(host_tokens.data(), B, T, 0); }), N * 12.0);
  report("encoder_backward", time_ms([&] { llmc::encoder_backward(dwte, dwpe, act, plan, B, T, C, 0); }),
         NC * kBf16 + 2.0 * plan.num_buckets * C * kF32 + 2.0 * T * C * kF32);
  // Text is not uniform: token ids with Zipf-like frequencies (p(rank r) ~ 1/r over 5,000 ids; the most frequent id
  // is ~11% of the batch, as "the" / "," are in English text), which puts thousands of rows into a few buckets.
  {
    std::vector<double> weights(5000);
    for (size_t r = 0; r < weights.size(); r++) weights[r] = 1.0 / static_cast<double>(r + 1);
    std::discrete_distribution<int> zipf(weights.begin(), weights.end());
    std::vector<int> text_tokens(N);
    for (int& t : text_tokens) t = zipf(rng) * 7;  // spread over the vocabulary
    llmc::EncoderBackwardPlan text_plan;
    text_plan.build(text_tokens.data(), B, T, 0);
    report("encoder_backward (Zipf token ids)",
           time_ms([&] { llmc::encoder_backward(dwte, dwpe, act, text_plan, B, T, C, 0); }),
           NC * kBf16 + 2.0 * text_plan.num_buckets * C * kF32 + 2.0 * T * C * kF32);
    CUDA_CHECK(cudaDeviceSynchronize());
    text_plan.free();
  }

  // LayerNorm
  bf16* weight = device_random<bf16>(C, rng, 0.5f, 1.5f);
  bf16* bias = device_random<bf16>(C, rng);
  float* mean = device_random<float>(N, rng);
  float* rstd = device_random<float>(N, rng, 0.5f, 2.0f);
  report("layernorm_forward",
         time_ms([&] { llmc::layernorm_forward(out, mean, rstd, act, weight, bias, N, C, 0); }),
         NC * kBf16 * 2 + N * 2.0 * kF32);
  bf16* residual = device_random<bf16>(NC, rng);
  report("fused_residual_layernorm_forward",
         time_ms([&] {
           llmc::fused_residual_layernorm_forward(residual, out, mean, rstd, act, act2, weight, bias, N, C, 0);
         }),
         NC * kBf16 * 4 + N * 2.0 * kF32);
  float* dweight = device_random<float>(C, rng);
  float* dbias = device_random<float>(C, rng);
  float* scratch = device_alloc<float>(std::max(llmc::layernorm_backward_scratch_floats(N, C),
                                                llmc::bias_backward_scratch_floats(N, 4 * C)));
  report("layernorm_backward",
         time_ms([&] {
           llmc::layernorm_backward(out, dweight, dbias, scratch, act, act2, weight, mean, rstd, N, C, 0);
         }),
         NC * kBf16 * 4 + N * 2.0 * kF32);  // dout, inp, dinp read + dinp written
  float* dinp_sum = device_random<float>(C, rng);
  report("layernorm_backward (+ dinp column sums)",
         time_ms([&] {
           llmc::layernorm_backward(out, dweight, dbias, scratch, act, act2, weight, mean, rstd, N, C, 0, nullptr,
                                    dinp_sum);
         }),
         NC * kBf16 * 4 + N * 2.0 * kF32);

  // GELU on the MLP hidden activations (N, 4C)
  bf16* hidden = device_random<bf16>(4 * NC, rng);
  bf16* hidden_out = device_random<bf16>(4 * NC, rng);
  report("gelu_forward (N, 4C)", time_ms([&] { llmc::gelu_forward(hidden_out, hidden, 4 * NC, 0); }),
         4.0 * NC * kBf16 * 2);
  report("gelu_backward_inplace (N, 4C)",
         time_ms([&] { llmc::gelu_backward_inplace(hidden_out, hidden, 4 * NC, 0); }), 4.0 * NC * kBf16 * 3);

  // Classifier: the logits are overwritten by dlogits, so they are restored (untimed) before each run.
  const size_t NV = static_cast<size_t>(N) * Vp;
  bf16* logits_init = device_random<bf16>(NV, rng, -4.0f, 4.0f);
  bf16* logits = device_alloc<bf16>(NV);
  float* losses = device_alloc<float>(N);
  int* targets = tokens;
  auto restore_logits = [&] { CUDA_CHECK(cudaMemcpy(logits, logits_init, NV * kBf16, cudaMemcpyDeviceToDevice)); };
  report("fused_classifier (loss only)",
         time_ms([&] { llmc::fused_classifier(logits, losses, targets, N, V, Vp, 1.0f / N, false, 0); },
                 restore_logits),
         NV * kBf16 + N * 8.0);
  report("fused_classifier (+ dlogits)",
         time_ms([&] { llmc::fused_classifier(logits, losses, targets, N, V, Vp, 1.0f / N, true, 0); },
                 restore_logits),
         NV * kBf16 * 2 + N * 8.0);

  // Bias gradient of the MLP up-projection (N, 4C)
  float* dbias4 = device_random<float>(4 * C, rng);
  report("bias_backward (N, 4C)", time_ms([&] { llmc::bias_backward(dbias4, scratch, hidden, N, 4 * C, 0); }),
         4.0 * NC * kBf16 + 4.0 * C * kF32 * 2);

  // Optimizer over all 124M parameters as one flat tensor
  const size_t P = 124475904;
  float* master = device_random<float>(P, rng);
  float* grads = device_random<float>(P, rng, -0.01f, 0.01f);
  float* m = device_random<float>(P, rng, -0.01f, 0.01f);
  float* v = device_random<float>(P, rng, 0.0f, 1e-4f);
  bf16* params = device_alloc<bf16>(P);
  float* norm_partials = device_alloc<float>(llmc::global_norm_partials_per_tensor());
  float* norm = device_alloc<float>(1);
  float* grad_scale = device_alloc<float>(1);
  report("global_norm (124M floats)", time_ms([&] {
           llmc::global_norm_squared(norm_partials, grads, P, 0);
           llmc::global_norm_finish(norm, norm_partials, llmc::global_norm_partials_per_tensor(), 0);
           llmc::clip_scale_from_norm(grad_scale, norm, 1.0f, 0);
         }),
         P * kF32);
  report("adamw_update (124M params)", time_ms([&] {
           llmc::adamw_update(master, params, grads, m, v, P, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, grad_scale, 0);
         }),
         P * (4 * kF32 + 3 * kF32 + kBf16));  // read master, grads, m, v; write master, m, v, params
  bf16* m16 = device_random<bf16>(P, rng, -0.01f, 0.01f);
  bf16* v16 = device_random<bf16>(P, rng, 0.0f, 1e-4f);
  report("adamw_update, bf16 moments (124M params)", time_ms([&] {
           llmc::adamw_update(master, params, grads, m16, v16, P, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, grad_scale, 0);
         }),
         P * (2 * kF32 + 2 * kBf16 + kF32 + 2 * kBf16 + kBf16));  // read master, grads, m, v; write master, m, v, params
  report("convert_float_to_bf16 (124M)", time_ms([&] { llmc::convert_float_to_bf16(params, master, P, 0); }),
         P * (kF32 + kBf16));

  plan.free();
  for (void* p : g_allocations) CUDA_CHECK(cudaFree(p));
  return 0;
}
