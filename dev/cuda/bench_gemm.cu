// dev/cuda/bench_gemm.cu: TFLOP/s of the cuBLASLt products of llmc/precision/gemm.h, BF16 and FP8.
//
//   ./build/dev/cuda/bench_gemm [iters] [suite]        iters: timed calls per GEMM (default 20)
//                                                      suite: all (default) | bf16 | fp8
//
// bf16 suite: the three BF16 products (forward, dgrad, wgrad) of every linear layer of GPT-2 124M and 350M, lm_head
//   included, at M = B*T = 16384, 32768, 65536 rows.
// fp8 suite: each product of each layer in five modes, next to each other:
//   bf16          matmul_forward / matmul_dgrad / matmul_wgrad (bf16 in, FP32 accumulation; wgrad into FP32 +=)
//   fp8 tensor    per-tensor scales, split accumulation: fprop e4m3*e4m3, dgrad and wgrad e5m2 (gradient) * e4m3
//   fp8 fast      the same with fast accumulation (Transformer Engine uses it in fprop, precision.fast_accum = true here;
//                 timed for all three)
//   blk 1x128*128 block scales, e4m3: A 1x128, B 128x128 (the block recipe's fprop X*W and dgrad dY*W^T)
//   blk 1x128*1x128  both 1x128 (the block recipe's wgrad dY^T*X^T, both quantised along the tokens)
//   As FP8 GEMMs D (m,n) = A (m,k) * B (n,k)^T: fprop (tokens, out, in), dgrad (tokens, in, out), wgrad (out, in,
//   tokens); bf16 / fp8 D for fprop and dgrad, FP32 D accumulated for wgrad. Inputs are already quantised: this is
//   the GEMM alone, without the casts.
//   Shapes: GPT-2 124M (C 768) and 350M (C 1024): qkv, attproj, fc, fcproj at 16384 and 32768 tokens; Llama-1B
//   (C 2048, 8 KV heads of 64: qkv N = 2048 + 2*512 = 3072, FFN 8192): qkv, o, up, down at 16384 and 32768 tokens;
//   and the 8192^3 "ceiling" product.
// Every GEMM is spot-checked first (sampled elements against an FP64 dot product of the inputs; FP8 inputs from the
// codes and the scales in their layouts). Timing: cudaEvents around `iters` back-to-back calls after 3 warm-up calls.
// The fp8 suite ends with a table of TFLOP/s and the speedup over bf16 per mode, and the geometric-mean speedups.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "llmc/core/common.h"
#include "llmc/precision/encoding.h"
#include "llmc/precision/gemm.h"
#include "llmc/precision/scale_math.cuh"

using namespace llmc;

namespace {

struct Linear {
  const char* name;
  int N, K;  // weight (N, K): out_features, in_features
};

// Device buffers are filled by tiling one random pattern (a prime number of elements, so rows do not repeat in
// step); the host reads the pattern to compute reference values without holding the multi-GB matrices.
constexpr size_t kPatternSize = 1048573;  // prime

struct Pattern {
  std::vector<bf16> bits;
  std::vector<float> values;
  explicit Pattern(uint32_t seed) : bits(kPatternSize), values(kPatternSize) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (size_t i = 0; i < kPatternSize; i++) {
      bits[i] = __float2bfloat16(dist(rng));
      values[i] = __bfloat162float(bits[i]);
    }
  }
  float at(size_t i) const { return values[i % kPatternSize]; }
  bf16* upload(size_t n) const {
    bf16* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(bf16)));
    for (size_t off = 0; off < n; off += kPatternSize) {
      const size_t count = std::min(kPatternSize, n - off);
      CUDA_CHECK(cudaMemcpy(d + off, bits.data(), count * sizeof(bf16), cudaMemcpyHostToDevice));
    }
    return d;
  }
};

// FP8 codes, random bytes with bit 6 cleared: finite in both formats, |value| < 2, subnormals included.
struct CodePattern {
  std::vector<uint8_t> codes;
  explicit CodePattern(uint32_t seed) : codes(kPatternSize) {
    std::mt19937 rng(seed);
    for (auto& c : codes) c = (uint8_t)(rng() & 0xBF);
  }
  uint8_t at(size_t i) const { return codes[i % kPatternSize]; }
  uint8_t* upload(size_t n) const {
    uint8_t* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, n));
    for (size_t off = 0; off < n; off += kPatternSize) {
      const size_t count = std::min(kPatternSize, n - off);
      CUDA_CHECK(cudaMemcpy(d + off, codes.data(), count, cudaMemcpyHostToDevice));
    }
    return d;
  }
};

double decode_fp8(uint8_t code, ElementFormat f) {
  return (double)__half2float(__half(__nv_cvt_fp8_to_halfraw(code, f == ElementFormat::E4M3 ? __NV_E4M3 : __NV_E5M2)));
}

// Spot check: 32 sampled output elements of the BF16 forward product against an FP64 dot product.
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

// ---------------------------------------------------------------------------------------------------------------
// bf16 suite (the original benchmark)

bool run_bf16_suite(int iters) {
  struct Model {
    const char* name;
    int C;
  };
  const Model models[] = {{"gpt2-124m", 768}, {"gpt2-350m", 1024}};
  const int Ms[] = {16384, 32768, 65536};
  const int Vp = 50304;
  bool all_ok = true;
  const Pattern pat_inp(1), pat_w(2), pat_dout(3);
  std::printf("\n== bf16: GPT-2 linear layers\n");
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
  return all_ok;
}

// ---------------------------------------------------------------------------------------------------------------
// fp8 suite

enum Mode { kBf16 = 0, kTensor, kTensorFast, kBlock1x128x128, kBlock1x128x1x128, kModes };
const char* const kModeNames[kModes] = {"bf16", "fp8 tensor", "fp8 fast", "blk 1x128*128", "blk 1x128*1x128"};
enum Product { kFprop = 0, kDgrad, kWgrad };
const char* const kProductNames[] = {"fprop", "dgrad", "wgrad"};

// One FP8 operand of the benchmark: (rows, k) codes tiled from a pattern (uploaded once per product: the same bytes
// serve as e4m3 or e5m2), its format, and scales in the GEMM-ready layout (per tensor: one non-power-of-two value;
// blocks: powers of two and 0.75 multiples varying by entry).
struct BenchOperand {
  const CodePattern* pattern = nullptr;
  const uint8_t* d_codes = nullptr;  // not owned
  int rows = 0, k = 0;
  Encoding encoding;
  std::vector<float> scales;
  float* d_scales = nullptr;

  BenchOperand(const CodePattern& pat, const uint8_t* codes, int rows_, int k_, ElementFormat f, BlockShape g,
               float tensor_scale)
      : pattern(&pat), d_codes(codes), rows(rows_), k(k_), encoding{f, g} {
    const size_t count = scale_inv_count(encoding, rows, k);
    scales.resize(count);
    if (encoding.per_tensor()) {
      scales[0] = tensor_scale;
    } else {
      for (size_t i = 0; i < count; i++) scales[i] = std::ldexp(1.0f, (int)((i * 7) % 9) - 4) * (i % 3 ? 1.0f : 0.75f);
    }
    CUDA_CHECK(cudaMalloc(&d_scales, count * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_scales, scales.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~BenchOperand() { cudaFree(d_scales); }
  BenchOperand(const BenchOperand&) = delete;
  BenchOperand& operator=(const BenchOperand&) = delete;

  QuantOperand op() const {
    QuantOperand o;
    o.data = d_codes;
    o.encoding = encoding;
    o.scale_inv = d_scales;
    return o;
  }
  // dequantised element (r, c), the scale read from the layout of llmc/precision/tensor.h
  double value(int r, int c) const {
    const double s = scales[scale_index(encoding.block, r, c, scale_inv_ld(encoding, rows, k))];
    return decode_fp8(pattern->at((size_t)r * k + c), encoding.element) * s;
  }
};

// 16 sampled elements of D (m, n) = A·Bᵀ against FP64, with the FP8 test's tolerance (test/precision/test_gemm_fp8.cu).
bool spot_check_fp8(const void* d_out, bool d_fp32, const BenchOperand& A, const BenchOperand& B, int m, int n, int k,
                     bool fast) {
  std::mt19937 rng(11);
  const double acc = (fast ? std::ldexp(1.0, -12) * (k / 128.0) : std::ldexp(1.0, -11)) + 4.0 * k * std::ldexp(1.0, -24);
  for (int s = 0; s < 16; s++) {
    const int i = rng() % m, j = rng() % n;
    double ref = 0, absref = 0;
    for (int c = 0; c < k; c++) {
      const double prod = A.value(i, c) * B.value(j, c);
      ref += prod;
      absref += std::fabs(prod);
    }
    double got;
    if (d_fp32) {
      float g;
      CUDA_CHECK(cudaMemcpy(&g, (const float*)d_out + (size_t)i * n + j, sizeof(float), cudaMemcpyDeviceToHost));
      got = g;
    } else {
      bf16 g;
      CUDA_CHECK(cudaMemcpy(&g, (const bf16*)d_out + (size_t)i * n + j, sizeof(bf16), cudaMemcpyDeviceToHost));
      got = __bfloat162float(g);
    }
    const double tol = acc * absref + (d_fp32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -8)) * std::fabs(ref);
    if (!(std::fabs(got - ref) <= tol)) {
      std::printf("MISMATCH at (%d, %d): got %g expected %g (tol %g)\n", i, j, got, ref, tol);
      return false;
    }
  }
  return true;
}

struct Fp8Row {
  std::string model, layer, product;
  int M = 0, N = 0, K = 0;                        // the layer: tokens, out, in
  double tflops[kModes] = {0, 0, 0, 0, 0};       // 0: unsupported
  bool ok = true;
};

// Times one product of one layer in every mode. Layer: weight (N, K), M tokens.
Fp8Row bench_product(const char* model, const char* layer, Product p, int M, int N, int K, int iters,
                     const Pattern& pat_a, const Pattern& pat_b, const CodePattern& code_a,
                     const CodePattern& code_b) {
  Fp8Row row;
  row.model = model;
  row.layer = layer;
  row.product = kProductNames[p];
  row.M = M;
  row.N = N;
  row.K = K;
  const double flops = 2.0 * M * N * K;
  // As FP8 GEMMs D (m, n) = A (m, k) · B (n, k)ᵀ
  int m = M, n = N, k = K;
  if (p == kDgrad) {
    m = M;
    n = K;
    k = N;
  } else if (p == kWgrad) {
    m = N;
    n = K;
    k = M;
  }
  const bool d_fp32 = p == kWgrad;
  void* d_out = nullptr;
  CUDA_CHECK(cudaMalloc(&d_out, (size_t)m * n * (d_fp32 ? sizeof(float) : sizeof(bf16))));
  CUDA_CHECK(cudaMemset(d_out, 0, (size_t)m * n * (d_fp32 ? sizeof(float) : sizeof(bf16))));

  // bf16: the layer's own product through matmul_forward / dgrad / wgrad (same FLOPs)
  {
    bf16* a = pat_a.upload((size_t)m * k);
    bf16* b = pat_b.upload((size_t)n * k);
    double t = 0;
    if (p == kFprop) {
      t = time_ms([&] { matmul_forward((bf16*)d_out, a, b, nullptr, M, N, K, 0); }, iters);  // inp (M,K), W (N,K)
    } else if (p == kDgrad) {
      // dinp (M, K) = dout (M, N) · W (N, K): a holds dout (M×N = m×k), b holds W (N×K = k×n)
      t = time_ms([&] { matmul_dgrad((bf16*)d_out, a, b, M, N, K, false, 0); }, iters);
    } else {
      // dW (N, K) += dout (M, N)ᵀ · inp (M, K): a holds dout (M×N), b holds inp (M×K); same element counts
      t = time_ms([&] { matmul_wgrad((float*)d_out, a, b, M, N, K, true, 0); }, iters);
    }
    row.tflops[kBf16] = flops / t * 1e-9;
    cudaFree(a);
    cudaFree(b);
  }

  uint8_t* codes_a = code_a.upload((size_t)m * k);  // (m, k)
  uint8_t* codes_b = code_b.upload((size_t)n * k);  // (n, k)
  for (int mode = kTensor; mode < kModes; mode++) {
    ElementFormat af = ElementFormat::E4M3, bf = ElementFormat::E4M3;
    BlockShape ag = kWholeTensor, bg = kWholeTensor;
    if (mode == kTensor || mode == kTensorFast) {
      if (p != kFprop) af = ElementFormat::E5M2;  // the gradient
    } else {
      ag = kBlock1x128;
      bg = mode == kBlock1x128x128 ? kBlock128x128 : kBlock1x128;
    }
    BenchOperand A(code_a, codes_a, m, k, af, ag, 0.375f), B(code_b, codes_b, n, k, bf, bg, 1.5f);
    QuantGemmOptions opt;
    opt.fast_accum = mode == kTensorFast;
    if (!matmul_quant_supported(d_fp32, A.op(), B.op(), m, n, k, opt)) continue;  // tflops stays 0: n/a
    // spot check an overwriting call, then time (wgrad accumulates, as in training)
    if (d_fp32) {
      matmul_quant((float*)d_out, A.op(), B.op(), m, n, k, opt, 0);
    } else {
      matmul_quant((bf16*)d_out, A.op(), B.op(), m, n, k, opt, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const bool ok = spot_check_fp8(d_out, d_fp32, A, B, m, n, k, opt.fast_accum);
    if (!ok) std::printf("  (%s %s %s %s)\n", model, layer, kProductNames[p], kModeNames[mode]);
    row.ok &= ok;
    opt.accumulate = d_fp32;
    const double t = time_ms(
        [&] {
          if (d_fp32) {
            matmul_quant((float*)d_out, A.op(), B.op(), m, n, k, opt, 0);
          } else {
            matmul_quant((bf16*)d_out, A.op(), B.op(), m, n, k, opt, 0);
          }
        },
        iters);
    row.tflops[mode] = flops / t * 1e-9;
  }
  cudaFree(codes_a);
  cudaFree(codes_b);
  cudaFree(d_out);
  return row;
}

void print_fp8_header() {
  std::printf("%-10s %-8s %-5s %6s %6s %6s %8s", "model", "layer", "prod", "M", "N", "K", "bf16");
  for (int mode = kTensor; mode < kModes; mode++) std::printf(" %17s", kModeNames[mode]);
  std::printf("\n");
}

void print_fp8_row(const Fp8Row& r) {
  std::printf("%-10s %-8s %-5s %6d %6d %6d %8.1f", r.model.c_str(), r.layer.c_str(), r.product.c_str(), r.M, r.N, r.K,
              r.tflops[kBf16]);
  for (int mode = kTensor; mode < kModes; mode++) {
    if (r.tflops[mode] > 0) {
      std::printf(" %9.1f (%4.2fx)", r.tflops[mode], r.tflops[mode] / r.tflops[kBf16]);
    } else {
      std::printf(" %17s", "n/a");
    }
  }
  std::printf("%s\n", r.ok ? "" : "  WRONG");
}

bool run_fp8_suite(int iters) {
  struct Shape {
    const char* model;
    int C;          // model width
    int qkv_n;      // qkv output features
    int ffn;        // MLP hidden
    const char* names[4];
  };
  const Shape models[] = {{"gpt2-124m", 768, 3 * 768, 4 * 768, {"qkv", "attproj", "fc", "fcproj"}},
                          {"gpt2-350m", 1024, 3 * 1024, 4 * 1024, {"qkv", "attproj", "fc", "fcproj"}},
                          {"llama-1b", 2048, 2048 + 2 * 512, 8192, {"qkv", "o", "up", "down"}}};
  const int Ms[] = {16384, 32768};
  const Pattern pat_a(21), pat_b(22);
  const CodePattern code_a(23), code_b(24);
  std::vector<Fp8Row> rows;
  std::printf("\n== fp8 vs bf16 (TFLOP/s, speedup over bf16), GEMM alone (inputs already quantised)\n");
  print_fp8_header();
  auto run = [&](const char* model, const char* layer, int M, int N, int K) {
    for (int p = kFprop; p <= kWgrad; p++) {
      rows.push_back(bench_product(model, layer, (Product)p, M, N, K, iters, pat_a, pat_b, code_a, code_b));
      print_fp8_row(rows.back());
    }
  };
  for (const Shape& s : models) {
    const Linear layers[] = {{s.names[0], s.qkv_n, s.C}, {s.names[1], s.C, s.C}, {s.names[2], s.ffn, s.C},
                             {s.names[3], s.C, s.ffn}};
    for (int M : Ms) {
      for (const Linear& L : layers) run(s.model, L.name, M, L.N, L.K);
    }
  }
  run("ceiling", "8192^3", 8192, 8192, 8192);

  // The table again, in one piece, and the geometric-mean speedup of each mode.
  std::printf("\n== fp8 summary on %s (TFLOP/s and speedup over bf16)\n", cuda_device_name().c_str());
  print_fp8_header();
  bool all_ok = true;
  double log_sum[kModes] = {0, 0, 0, 0, 0};
  int count[kModes] = {0, 0, 0, 0, 0};
  for (const Fp8Row& r : rows) {
    print_fp8_row(r);
    all_ok &= r.ok;
    for (int mode = kTensor; mode < kModes; mode++) {
      if (r.tflops[mode] > 0) {
        log_sum[mode] += std::log(r.tflops[mode] / r.tflops[kBf16]);
        count[mode]++;
      }
    }
  }
  std::printf("geometric-mean speedup over bf16:");
  for (int mode = kTensor; mode < kModes; mode++) {
    if (count[mode] > 0) {
      std::printf("  %s %.2fx (%d GEMMs)", kModeNames[mode], std::exp(log_sum[mode] / count[mode]), count[mode]);
    } else {
      std::printf("  %s n/a", kModeNames[mode]);
    }
  }
  std::printf("\n");
  return all_ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  const std::string suite = argc > 2 ? argv[2] : "all";
  if (argc > 3 || iters <= 0 || (suite != "all" && suite != "bf16" && suite != "fp8")) {
    std::fprintf(stderr, "usage: bench_gemm [iters > 0] [all|bf16|fp8]\n");
    return 2;
  }
  if (cuda_device_count() == 0) {
    std::printf("bench_gemm: no CUDA GPU on this machine\n");
    return 1;
  }
  std::printf("device: %s, iters %d, suite %s\n", cuda_device_name().c_str(), iters, suite.c_str());
  gemm_init();
  bool all_ok = true;
  if (suite == "all" || suite == "bf16") all_ok &= run_bf16_suite(iters);
  if (suite == "all" || suite == "fp8") all_ok &= run_fp8_suite(iters);
  gemm_shutdown();
  std::printf(all_ok ? "all spot checks passed\n" : "SPOT CHECK FAILED\n");
  return all_ok ? 0 : 1;
}
