// test/kernels/test_llama_kernel_refs: the CPU references of the Llama kernels (llmc/kernels/rmsnorm.cu, rope.cu, swiglu.cu),
// which test/kernels/test_llama_kernels trusts, checked on their own: forward values against hand computations and known
// constants, backward references against central finite differences of the forward references (RoPE, being linear,
// also against its adjoint identity), and the += accumulation that rmsnorm_backward promises.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/kernels/rmsnorm.h"
#include "llmc/kernels/rope.h"
#include "test/reference/kernels_ref.h"
#include "test/support/finite_diff.h"

namespace {

using llmc_test::dot;
using llmc_test::finite_difference;
using llmc_test::kFdStep;
using llmc_test::kFdTolerance;
using llmc_test::random_vector;

// ---------------------------------------------------------------------------------------------------------------
// RMSNorm
TEST(RmsNormRef, ForwardHasUnitRootMeanSquare) {
  std::mt19937 rng(11);
  const int N = 3, C = 64;
  const float eps = 1e-5f;
  std::vector<float> inp = random_vector(N * C, rng, -3.0f, 5.0f), weight(C, 1.0f), out(N * C), rstd(N);
  llmc::rmsnorm_forward_cpu(out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
  for (int n = 0; n < N; n++) {
    double sq = 0.0, in_sq = 0.0;
    for (int c = 0; c < C; c++) {
      sq += static_cast<double>(out[n * C + c]) * out[n * C + c];
      in_sq += static_cast<double>(inp[n * C + c]) * inp[n * C + c];
    }
    EXPECT_NEAR(sq / C, 1.0, 1e-5);  // 1 - eps * rstd^2
    EXPECT_NEAR(rstd[n], 1.0 / std::sqrt(in_sq / C + eps), 1e-6 * rstd[n]);
    // No mean subtraction (unlike LayerNorm): the output is the input scaled by rstd.
    for (int c = 0; c < C; c++) EXPECT_NEAR(out[n * C + c], inp[n * C + c] * rstd[n], 1e-5);
  }
}

TEST(RmsNormRef, ForwardHandComputed) {
  // x = (3, 4), eps = 0.5: mean(x^2) = 12.5, rstd = 1/sqrt(13); weight (2, -1).
  const std::vector<float> x = {3.0f, 4.0f}, w = {2.0f, -1.0f};
  std::vector<float> out(2), rstd(1);
  llmc::rmsnorm_forward_cpu(out.data(), rstd.data(), x.data(), w.data(), 1, 2, 0.5f);
  const double r = 1.0 / std::sqrt(13.0);
  EXPECT_NEAR(rstd[0], r, 1e-7);
  EXPECT_NEAR(out[0], 6.0 * r, 1e-6);
  EXPECT_NEAR(out[1], -4.0 * r, 1e-6);
}

// L = sum(out * R): dout = R; dinp and dweight against finite differences, both added to pre-filled values.
TEST(RmsNormRef, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(12);
  const int N = 3, C = 16;
  const float eps = 1e-5f;
  std::vector<float> inp = random_vector(N * C, rng, -2.0f, 2.0f), weight = random_vector(C, rng, 0.5f, 1.5f),
                     R = random_vector(N * C, rng);
  auto loss = [&]() {
    std::vector<float> out(N * C);
    llmc::rmsnorm_forward_cpu(out.data(), nullptr, inp.data(), weight.data(), N, C, eps);
    return dot(out, R);
  };
  std::vector<float> out(N * C), rstd(N);
  llmc::rmsnorm_forward_cpu(out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
  const float dinp0 = 0.25f, dweight0 = -0.5f;
  std::vector<float> dinp(N * C, dinp0), dweight(C, dweight0);
  llmc::rmsnorm_backward_cpu(dinp.data(), dweight.data(), R.data(), inp.data(), weight.data(), rstd.data(), N, C);
  for (size_t i = 0; i < inp.size(); i++)
    EXPECT_NEAR(dinp[i] - dinp0, finite_difference(inp, i, loss), kFdTolerance) << "dinp[" << i << "]";
  for (int c = 0; c < C; c++)
    EXPECT_NEAR(dweight[c] - dweight0, finite_difference(weight, c, loss), kFdTolerance) << "dweight[" << c << "]";
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE
struct RopeShape {
  int B, T, NH, NKV, HS;
  int width() const { return (NH + 2 * NKV) * HS; }
  size_t size() const { return static_cast<size_t>(B) * T * width(); }
};

// Position 0 is the identity; value heads are never touched.
TEST(RopeRef, PositionZeroIsIdentityAndValuesUntouched) {
  std::mt19937 rng(21);
  const RopeShape s{2, 5, 4, 2, 16};
  std::vector<float> x = random_vector(s.size(), rng), y = x;
  llmc::rope_forward_cpu(y.data(), s.B, s.T, s.NH, s.NKV, s.HS, 10000.0f);
  for (int b = 0; b < s.B; b++)
    for (int t = 0; t < s.T; t++)
      for (int j = 0; j < s.width(); j++) {
        const size_t i = (static_cast<size_t>(b) * s.T + t) * s.width() + j;
        const bool value_head = j >= (s.NH + s.NKV) * s.HS;
        if (t == 0 || value_head) EXPECT_EQ(y[i], x[i]) << "b " << b << " t " << t << " j " << j;
      }
}

// The Hugging Face rotate_half convention, computed by hand for one head: HS = 4, theta = 100, t = 3: the pairs are
// (0, 2) with inv_freq 1 and (1, 3) with inv_freq 100^(-1/2) = 0.1.
TEST(RopeRef, RotateHalfHandComputed) {
  const int T = 4, HS = 4;
  std::vector<float> qkv(static_cast<size_t>(T) * 3 * HS, 0.0f);
  const float v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  for (int k = 0; k < 4; k++) qkv[3 * 3 * HS + k] = v[k];  // query head at t = 3
  llmc::rope_forward_cpu(qkv.data(), 1, T, 1, 1, HS, 100.0f);
  const double a0 = 3.0, a1 = 3.0f * 0.1f;  // FP32 angles
  const float* q = &qkv[3 * 3 * HS];
  EXPECT_NEAR(q[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(q[2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-6);
  EXPECT_NEAR(q[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  EXPECT_NEAR(q[3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-6);
}

// A rotation keeps the length of every (i, i + HS/2) pair, and backward undoes forward.
TEST(RopeRef, RotationPreservesPairsAndBackwardInverts) {
  std::mt19937 rng(22);
  const RopeShape s{2, 37, 8, 2, 64};
  const std::vector<float> x = random_vector(s.size(), rng);
  std::vector<float> y = x;
  llmc::rope_forward_cpu(y.data(), s.B, s.T, s.NH, s.NKV, s.HS, 500000.0f);
  const int half = s.HS / 2;
  for (size_t row = 0; row < static_cast<size_t>(s.B) * s.T; row++)
    for (int h = 0; h < s.NH + s.NKV; h++)
      for (int i = 0; i < half; i++) {
        const size_t lo = row * s.width() + h * s.HS + i, hi = lo + half;
        EXPECT_NEAR(std::hypot(y[lo], y[hi]), std::hypot(x[lo], x[hi]), 1e-6);
      }
  llmc::rope_backward_cpu(y.data(), s.B, s.T, s.NH, s.NKV, s.HS, 500000.0f);
  for (size_t i = 0; i < x.size(); i++) ASSERT_NEAR(y[i], x[i], 1e-6) << i;
}

// RoPE is linear: <rope(x), r> = <x, rope_backward(r)> for all x, r (the backward is the adjoint), and the gradient of
// sum(rope(x) * r) by finite differences is rope_backward(r).
TEST(RopeRef, BackwardIsTheAdjoint) {
  std::mt19937 rng(23);
  const RopeShape s{2, 9, 4, 1, 32};
  std::vector<float> x = random_vector(s.size(), rng);
  const std::vector<float> r = random_vector(s.size(), rng);
  std::vector<float> fx = x, br = r;
  llmc::rope_forward_cpu(fx.data(), s.B, s.T, s.NH, s.NKV, s.HS, 10000.0f);
  llmc::rope_backward_cpu(br.data(), s.B, s.T, s.NH, s.NKV, s.HS, 10000.0f);
  EXPECT_NEAR(dot(fx, r), dot(x, br), 1e-5 * std::sqrt(static_cast<double>(x.size())));
  auto loss = [&]() {
    std::vector<float> y = x;
    llmc::rope_forward_cpu(y.data(), s.B, s.T, s.NH, s.NKV, s.HS, 10000.0f);
    return dot(y, r);
  };
  for (size_t i = 0; i < x.size(); i += 7)
    EXPECT_NEAR(br[i], finite_difference(x, i, loss), kFdTolerance) << "dqkv[" << i << "]";
}

// ---------------------------------------------------------------------------------------------------------------
// SwiGLU
TEST(SwigluRef, ForwardKnownValues) {
  // silu(g) = g * sigmoid(g): silu(1) = 0.7310585786, silu(-2) = -0.2384058440, silu(0) = 0.
  const int N = 1, F = 3;
  const std::vector<float> gate_up = {1.0f, -2.0f, 0.0f, /*up*/ 2.0f, 0.5f, 7.0f};
  std::vector<float> out(F);
  llmc::swiglu_forward_cpu(out.data(), gate_up.data(), N, F);
  EXPECT_NEAR(out[0], 2.0 * 0.7310585786300049, 1e-6);
  EXPECT_NEAR(out[1], 0.5 * -0.23840584404423515, 1e-6);
  EXPECT_EQ(out[2], 0.0f);
}

TEST(SwigluRef, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(31);
  const int N = 3, F = 8;
  std::vector<float> gate_up = random_vector(static_cast<size_t>(N) * 2 * F, rng, -4.0f, 4.0f);
  const std::vector<float> dout = random_vector(static_cast<size_t>(N) * F, rng);
  auto loss = [&]() {
    std::vector<float> out(static_cast<size_t>(N) * F);
    llmc::swiglu_forward_cpu(out.data(), gate_up.data(), N, F);
    return dot(out, dout);
  };
  std::vector<float> dgate_up(gate_up.size(), NAN);  // overwritten, never read
  llmc::swiglu_backward_cpu(dgate_up.data(), dout.data(), gate_up.data(), N, F);
  for (size_t i = 0; i < gate_up.size(); i++)
    EXPECT_NEAR(dgate_up[i], finite_difference(gate_up, i, loss), kFdTolerance) << "dgate_up[" << i << "]";
}

// ---------------------------------------------------------------------------------------------------------------
// Token embedding without positions (Llama): wpe = dwpe = null.
TEST(EncoderRef, TokenOnlyEmbedding) {
  std::mt19937 rng(41);
  const int B = 2, T = 5, C = 8, Vp = 7;
  const std::vector<int> tokens = {3, 0, 6, 3, 1, 1, 2, 5, 6, 0};
  const std::vector<float> wte = random_vector(static_cast<size_t>(Vp) * C, rng);
  std::vector<float> out(static_cast<size_t>(B) * T * C);
  llmc::encoder_forward_cpu(out.data(), tokens.data(), wte.data(), nullptr, B, T, C);
  for (int n = 0; n < B * T; n++)
    for (int c = 0; c < C; c++) EXPECT_EQ(out[n * C + c], wte[tokens[n] * C + c]);
  const std::vector<float> dout = random_vector(out.size(), rng);
  std::vector<float> with_pos(wte.size(), 0.5f), without_pos(wte.size(), 0.5f), dwpe(static_cast<size_t>(T) * C, 0.0f);
  llmc::encoder_backward_cpu(with_pos.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  llmc::encoder_backward_cpu(without_pos.data(), nullptr, dout.data(), tokens.data(), B, T, C);
  EXPECT_EQ(with_pos, without_pos);
}

}  // namespace
