// test/precision/test_gemm.cu: the three cuBLASLt products of llmc/precision/gemm.h (forward with/without bias, GELU_AUX and an added
// residual, dgrad with/without accumulation and DGELU, wgrad with/without accumulation) against the FP64 CPU
// references on bf16-rounded random inputs, at GPT-2 shapes and odd shapes, with poisoned outputs; bitwise
// determinism, also between the tuned algorithms and the heuristic's first choice; errors for misaligned pointers and
// bad shapes.
//
// Tolerance per element: |gpu - ref| <= rel * |ref| + 1e-5 * absref, where absref = the same product on |inputs|
// (bounds the FP32 accumulation error) and rel = one bf16 ulp (2^-8) for bf16 outputs, 1e-6 for FP32 outputs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/precision/gemm.h"
#include "test/reference/precision_ref.h"

using namespace llmc;

namespace {

// Random bf16 values in [-1, 1): device copy and the exactly equal float values on the host.
struct Bf16Matrix {
  std::vector<float> host;  // bf16-rounded values
  bf16* dev = nullptr;
  Bf16Matrix(size_t n, std::mt19937& rng, float scale = 1.0f) : host(n) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<bf16> tmp(n);
    for (size_t i = 0; i < n; i++) {
      tmp[i] = __float2bfloat16(dist(rng));
      host[i] = __bfloat162float(tmp[i]);
    }
    CUDA_CHECK(cudaMalloc(&dev, n * sizeof(bf16)));
    CUDA_CHECK(cudaMemcpy(dev, tmp.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  ~Bf16Matrix() { cudaFree(dev); }
};

std::vector<float> abs_of(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = std::fabs(v[i]);
  return out;
}

std::vector<float> download_bf16(const bf16* dev, size_t n) {
  std::vector<bf16> tmp(n);
  CUDA_CHECK(cudaMemcpy(tmp.data(), dev, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(tmp[i]);
  return out;
}

std::vector<float> download_f32(const float* dev, size_t n) {
  std::vector<float> out(n);
  CUDA_CHECK(cudaMemcpy(out.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double u = k * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// Every element within rel * |ref| + 1e-5 * absref (+ abs_extra); reports the first few failures.
void expect_close(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<float>& absref,
                  double rel, const char* what, double abs_extra = 0.0) {
  ASSERT_EQ(got.size(), ref.size());
  size_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs((double)got[i] - ref[i]);
    const double tol = rel * std::fabs(ref[i]) + 1e-5 * absref[i] + abs_extra;
    worst = std::max(worst, err / (tol > 0 ? tol : 1e-30));
    if (!(err <= tol)) {  // also catches NaN (poisoned output never written)
      if (bad < 5) ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " expected " << ref[i];
      bad++;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
  std::printf("  %-40s worst err/tol = %.3f\n", what, worst);
}

template <typename T>
T* alloc_poisoned(size_t n) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(T)));  // NaN in bf16 and FP32
  return p;
}

struct Shape {
  int M, N, K;
};
// GPT-2 124M linear layers at M = B*T = 512 rows, and odd shapes (M not a multiple of 128, small N/K).
const Shape kShapes[] = {{512, 2304, 768}, {512, 768, 768}, {512, 3072, 768}, {512, 768, 3072},
                         {200, 1024, 256}, {77, 136, 40}, {1, 8, 8}, {333, 520, 1000}};

void run_forward_case(const Shape& s, bool with_bias, bool with_gelu) {
  std::mt19937 rng(1000 + s.M + 7 * s.N + 13 * s.K + (with_bias ? 1 : 0) + (with_gelu ? 2 : 0));
  Bf16Matrix inp((size_t)s.M * s.K, rng), weight((size_t)s.N * s.K, rng), bias(s.N, rng);
  bf16* out = alloc_poisoned<bf16>((size_t)s.M * s.N);
  bf16* pre = with_gelu ? alloc_poisoned<bf16>((size_t)s.M * s.N) : nullptr;
  matmul_forward(out, inp.dev, weight.dev, with_bias ? bias.dev : nullptr, s.M, s.N, s.K, 0, pre);
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> ref_f((size_t)s.M * s.N), absref((size_t)s.M * s.N);
  matmul_forward_cpu(ref_f.data(), inp.host.data(), weight.host.data(), with_bias ? bias.host.data() : nullptr, s.M,
                     s.N, s.K);
  std::vector<float> abs_bias = abs_of(bias.host);
  matmul_forward_cpu(absref.data(), abs_of(inp.host).data(), abs_of(weight.host).data(),
                     with_bias ? abs_bias.data() : nullptr, s.M, s.N, s.K);
  std::vector<double> ref(ref_f.begin(), ref_f.end());
  const double ulp = 1.0 / 256.0;
  if (!with_gelu) {
    expect_close(download_bf16(out, ref.size()), ref, absref, ulp, "forward out");
  } else {
    expect_close(download_bf16(pre, ref.size()), ref, absref, ulp, "forward pre_gelu (aux)");
    std::vector<double> ref_gelu(ref.size());
    for (size_t i = 0; i < ref.size(); i++) ref_gelu[i] = gelu_ref(ref[i]);
    // gelu' <= 1.13 carries the accumulation error; cuBLASLt's tanh may differ from libm by a few FP32 ulps
    expect_close(download_bf16(out, ref.size()), ref_gelu, absref, 1.5 * ulp, "forward gelu(out)", 1e-6);
  }
  // determinism: the same call again gives the same bits
  bf16* out2 = alloc_poisoned<bf16>((size_t)s.M * s.N);
  bf16* pre2 = with_gelu ? alloc_poisoned<bf16>((size_t)s.M * s.N) : nullptr;
  matmul_forward(out2, inp.dev, weight.dev, with_bias ? bias.dev : nullptr, s.M, s.N, s.K, 0, pre2);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(download_bf16(out, ref.size()), download_bf16(out2, ref.size())) << "forward not bitwise deterministic";
  cudaFree(out);
  cudaFree(out2);
  cudaFree(pre);
  cudaFree(pre2);
}

// out = residual + inp · weightᵀ (+ bias) in one rounding: against the FP64 reference of the same sum (the residual
// is added before the single bf16 rounding, so one ulp of the result bounds it, plus the accumulation term).
void run_forward_residual_case(const Shape& s, bool with_bias) {
  std::mt19937 rng(5000 + s.M + 7 * s.N + 13 * s.K + (with_bias ? 1 : 0));
  Bf16Matrix inp((size_t)s.M * s.K, rng), weight((size_t)s.N * s.K, rng), bias(s.N, rng);
  Bf16Matrix residual((size_t)s.M * s.N, rng, 4.0f);
  bf16* out = alloc_poisoned<bf16>((size_t)s.M * s.N);
  matmul_forward(out, inp.dev, weight.dev, with_bias ? bias.dev : nullptr, s.M, s.N, s.K, 0, nullptr, residual.dev);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ref_f((size_t)s.M * s.N), absref((size_t)s.M * s.N);
  matmul_forward_cpu(ref_f.data(), inp.host.data(), weight.host.data(), with_bias ? bias.host.data() : nullptr, s.M,
                     s.N, s.K);
  std::vector<float> abs_bias = abs_of(bias.host);
  matmul_forward_cpu(absref.data(), abs_of(inp.host).data(), abs_of(weight.host).data(),
                     with_bias ? abs_bias.data() : nullptr, s.M, s.N, s.K);
  std::vector<double> ref(ref_f.size());
  for (size_t i = 0; i < ref.size(); i++) {
    ref[i] = (double)ref_f[i] + residual.host[i];
    absref[i] += std::fabs(residual.host[i]);
  }
  const std::vector<float> got = download_bf16(out, ref.size());
  expect_close(got, ref, absref, 1.0 / 256.0, "forward residual + out");
  // the residual is really added: without it the result is off by it (a test that could not fail otherwise)
  size_t differs = 0;
  for (size_t i = 0; i < ref.size(); i++) differs += std::fabs(got[i] - ref_f[i]) > 0.5 * std::fabs(residual.host[i]);
  EXPECT_GT(differs, ref.size() / 2) << "the residual was not added";
  bf16* out2 = alloc_poisoned<bf16>((size_t)s.M * s.N);
  matmul_forward(out2, inp.dev, weight.dev, with_bias ? bias.dev : nullptr, s.M, s.N, s.K, 0, nullptr, residual.dev);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(got, download_bf16(out2, ref.size())) << "forward + residual not bitwise deterministic";
  EXPECT_EQ(residual.host, download_bf16(residual.dev, ref.size())) << "the residual input was modified";
  cudaFree(out);
  cudaFree(out2);
}

}  // namespace

TEST(Gemm, ForwardWithResidualMatchesCpu) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    std::printf("forward+residual M=%d N=%d K=%d\n", s.M, s.N, s.K);
    run_forward_residual_case(s, true);
    run_forward_residual_case(s, false);
  }
  std::mt19937 rng(1);
  Bf16Matrix a(64 * 64, rng), w(64 * 64, rng);
  bf16* out = alloc_poisoned<bf16>(64 * 64);
  bf16* pre = alloc_poisoned<bf16>(64 * 64);
  EXPECT_THROW(matmul_forward(out, a.dev, w.dev, nullptr, 64, 64, 64, 0, pre, a.dev), llmc::Error)
      << "a residual with the GELU_AUX epilogue";
  EXPECT_THROW(matmul_forward(out, a.dev, w.dev, nullptr, 64, 64, 64, 0, nullptr, out), llmc::Error)
      << "the residual aliasing the output";
  cudaFree(out);
  cudaFree(pre);
}

// The algorithm tuning (gemm_set_algorithm_tuning) may only pick algorithms that give the heuristic's first choice's
// bits: the same products with tuning off and on (its first, tuning call and a later call) are bitwise equal.
TEST(Gemm, TunedAlgorithmsGiveTheHeuristicChoicesBits) {
  const Shape shapes[] = {{4096, 3072, 768}, {4096, 768, 3072}, {4096, 2304, 768}, {333, 520, 1000}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    std::mt19937 rng(77 + s.M + s.N + s.K);
    Bf16Matrix inp((size_t)s.M * s.K, rng), weight((size_t)s.N * s.K, rng), bias(s.N, rng);
    Bf16Matrix dout((size_t)s.M * s.N, rng), pre_k((size_t)s.M * s.K, rng);
    // [tuning off, tuning on: first call, second call] x {forward + GELU_AUX: out, pre_gelu; dgrad + DGELU; dgrad}
    std::vector<float> results[3][4];
    for (int run = 0; run < 3; run++) {
      if (run < 2) {
        gemm_shutdown();  // forget the plans (and their tuned algorithms)
        gemm_set_algorithm_tuning(run == 1);
      }
      bf16* out = alloc_poisoned<bf16>((size_t)s.M * s.N);
      bf16* pre = alloc_poisoned<bf16>((size_t)s.M * s.N);
      bf16* dinp = alloc_poisoned<bf16>((size_t)s.M * s.K);
      bf16* dinp_gelu = alloc_poisoned<bf16>((size_t)s.M * s.K);
      matmul_forward(out, inp.dev, weight.dev, bias.dev, s.M, s.N, s.K, 0, pre);
      matmul_dgrad(dinp_gelu, dout.dev, weight.dev, s.M, s.N, s.K, false, 0, pre_k.dev);
      matmul_dgrad(dinp, dout.dev, weight.dev, s.M, s.N, s.K, false, 0);
      CUDA_CHECK(cudaDeviceSynchronize());
      results[run][0] = download_bf16(out, (size_t)s.M * s.N);
      results[run][1] = download_bf16(pre, (size_t)s.M * s.N);
      results[run][2] = download_bf16(dinp_gelu, (size_t)s.M * s.K);
      results[run][3] = download_bf16(dinp, (size_t)s.M * s.K);
      for (bf16* p : {out, pre, dinp, dinp_gelu}) cudaFree(p);
    }
    const char* names[4] = {"forward gelu(out)", "forward pre_gelu", "dgrad dgelu", "dgrad"};
    for (int r = 1; r < 3; r++)
      for (int i = 0; i < 4; i++)
        EXPECT_EQ(0, std::memcmp(results[0][i].data(), results[r][i].data(), results[0][i].size() * sizeof(float)))
            << names[i] << ": tuned run " << r << " differs from the heuristic's first algorithm";
  }
  gemm_set_algorithm_tuning(true);
}

TEST(Gemm, ForwardMatchesCpu) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    std::printf("forward M=%d N=%d K=%d\n", s.M, s.N, s.K);
    run_forward_case(s, false, false);
    run_forward_case(s, true, false);
  }
}

TEST(Gemm, ForwardGeluAuxMatchesCpu) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    std::printf("forward+gelu M=%d N=%d K=%d\n", s.M, s.N, s.K);
    run_forward_case(s, true, true);
    run_forward_case(s, false, true);
  }
}

TEST(Gemm, DgradMatchesCpu) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    std::printf("dgrad M=%d N=%d K=%d\n", s.M, s.N, s.K);
    std::mt19937 rng(2000 + s.M + s.N + s.K);
    Bf16Matrix dout((size_t)s.M * s.N, rng), weight((size_t)s.N * s.K, rng);
    Bf16Matrix initial((size_t)s.M * s.K, rng), pre_gelu((size_t)s.M * s.K, rng, 3.0f);
    const size_t n_out = (size_t)s.M * s.K;
    std::vector<float> ref_f(n_out), absref(n_out);
    matmul_dgrad_cpu(ref_f.data(), dout.host.data(), weight.host.data(), s.M, s.N, s.K);
    matmul_dgrad_cpu(absref.data(), abs_of(dout.host).data(), abs_of(weight.host).data(), s.M, s.N, s.K);
    const double ulp = 1.0 / 256.0;

    // overwrite, poisoned output
    bf16* dinp = alloc_poisoned<bf16>(n_out);
    matmul_dgrad(dinp, dout.dev, weight.dev, s.M, s.N, s.K, false, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> ref(ref_f.begin(), ref_f.end());
    std::vector<float> got = download_bf16(dinp, n_out);
    expect_close(got, ref, absref, ulp, "dgrad");
    matmul_dgrad(dinp, dout.dev, weight.dev, s.M, s.N, s.K, false, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(got, download_bf16(dinp, n_out)) << "dgrad not bitwise deterministic";

    // accumulate onto existing values: dinp = bf16(initial + dout · W)
    CUDA_CHECK(cudaMemcpy(dinp, initial.dev, n_out * sizeof(bf16), cudaMemcpyDeviceToDevice));
    matmul_dgrad(dinp, dout.dev, weight.dev, s.M, s.N, s.K, true, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> ref_acc(n_out);
    std::vector<float> absref_acc(n_out);
    for (size_t i = 0; i < n_out; i++) {
      ref_acc[i] = (double)initial.host[i] + ref_f[i];
      absref_acc[i] = std::fabs(initial.host[i]) + absref[i];
    }
    // With a bf16 C operand cuBLASLt rounds the product to bf16 before adding C (measured on H100), so the result
    // carries one rounding at the product's magnitude and one at the result's: tolerance ulp * (|product| + |result|),
    // expressed through absref (which expect_close scales by 1e-5) plus 2 ulps of the result.
    for (size_t i = 0; i < n_out; i++) absref_acc[i] += (float)(std::fabs(ref_f[i]) * ulp / 1e-5);
    expect_close(download_bf16(dinp, n_out), ref_acc, absref_acc, 2 * ulp, "dgrad accumulate");

    // DGELU epilogue: dinp = (dout · W) * gelu'(pre_gelu)
    CUDA_CHECK(cudaMemset(dinp, 0xFF, n_out * sizeof(bf16)));
    matmul_dgrad(dinp, dout.dev, weight.dev, s.M, s.N, s.K, false, 0, pre_gelu.dev);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> ref_dgelu(n_out);
    std::vector<float> absref_dgelu(n_out);
    for (size_t i = 0; i < n_out; i++) {
      const double g = gelu_grad_ref(pre_gelu.host[i]);
      ref_dgelu[i] = ref_f[i] * g;
      absref_dgelu[i] = absref[i] * (float)std::fabs(g);
    }
    // The DGELU epilogue rounds the product to bf16 before multiplying by gelu'(pre_gelu) (measured on H100: errors
    // up to 1.7 half-ulps of the result), so two roundings of 2^-8 relative each, plus the epilogue's tanh
    // approximation: 2.5 half-ulps relative.
    expect_close(download_bf16(dinp, n_out), ref_dgelu, absref_dgelu, 2.5 * ulp, "dgrad DGELU", 1e-6);
    cudaFree(dinp);
  }
}

TEST(Gemm, WgradMatchesCpu) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    std::printf("wgrad M=%d N=%d K=%d\n", s.M, s.N, s.K);
    std::mt19937 rng(3000 + s.M + s.N + s.K);
    Bf16Matrix dout((size_t)s.M * s.N, rng), inp((size_t)s.M * s.K, rng);
    const size_t n_out = (size_t)s.N * s.K;
    std::vector<float> ref_f(n_out), absref(n_out);
    matmul_wgrad_cpu(ref_f.data(), dout.host.data(), inp.host.data(), s.M, s.N, s.K);
    matmul_wgrad_cpu(absref.data(), abs_of(dout.host).data(), abs_of(inp.host).data(), s.M, s.N, s.K);

    float* dw = alloc_poisoned<float>(n_out);
    matmul_wgrad(dw, dout.dev, inp.dev, s.M, s.N, s.K, false, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> ref(ref_f.begin(), ref_f.end());
    std::vector<float> got = download_f32(dw, n_out);
    expect_close(got, ref, absref, 1e-6, "wgrad");
    matmul_wgrad(dw, dout.dev, inp.dev, s.M, s.N, s.K, false, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(0, std::memcmp(got.data(), download_f32(dw, n_out).data(), n_out * sizeof(float)))
        << "wgrad not bitwise deterministic";

    // accumulate twice onto random FP32 values: dw = init + 2 * doutᵀ · inp
    std::vector<float> init(n_out);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : init) x = dist(rng);
    CUDA_CHECK(cudaMemcpy(dw, init.data(), n_out * sizeof(float), cudaMemcpyHostToDevice));
    matmul_wgrad(dw, dout.dev, inp.dev, s.M, s.N, s.K, true, 0);
    matmul_wgrad(dw, dout.dev, inp.dev, s.M, s.N, s.K, true, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> ref_acc(n_out);
    std::vector<float> absref_acc(n_out);
    for (size_t i = 0; i < n_out; i++) {
      ref_acc[i] = (double)init[i] + 2.0 * ref_f[i];
      absref_acc[i] = std::fabs(init[i]) + 2.0f * absref[i];
    }
    expect_close(download_f32(dw, n_out), ref_acc, absref_acc, 1e-6, "wgrad accumulate x2");
    cudaFree(dw);
  }
}

TEST(Gemm, RejectsMisalignedPointersAndBadShapes) {
  std::mt19937 rng(7);
  Bf16Matrix a(64 * 64 + 8, rng), w(64 * 64 + 8, rng);
  bf16* out = alloc_poisoned<bf16>(64 * 64 + 8);
  // 2-byte offset: not 16-byte aligned
  EXPECT_THROW(matmul_forward(out, a.dev + 1, w.dev, nullptr, 64, 64, 64, 0), llmc::Error);
  EXPECT_THROW(matmul_forward(out + 1, a.dev, w.dev, nullptr, 64, 64, 64, 0), llmc::Error);
  // N and K must be multiples of 8 (leading dimensions)
  EXPECT_THROW(matmul_forward(out, a.dev, w.dev, nullptr, 64, 60, 64, 0), llmc::Error);
  EXPECT_THROW(matmul_dgrad(out, a.dev, w.dev, 64, 64, 36, false, 0), llmc::Error);
  EXPECT_THROW(matmul_forward(out, a.dev, w.dev, nullptr, 0, 64, 64, 0), llmc::Error);
  // DGELU cannot accumulate
  EXPECT_THROW(matmul_dgrad(out, a.dev, w.dev, 64, 64, 64, true, 0, a.dev), llmc::Error);
  // an 8-element (16-byte) offset is fine
  EXPECT_NO_THROW(matmul_forward(out + 8, a.dev + 8, w.dev + 8, nullptr, 64, 64, 64, 0));
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaFree(out);
}
