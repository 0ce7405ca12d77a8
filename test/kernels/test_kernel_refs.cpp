// test/kernels/test_kernel_refs: the CPU references of llmc/kernels/ (which the GPU tests trust) checked on their own:
// backward references against central finite differences of the forward references, the embedding backward against a
// naive loop, the AdamW reference against a step computed by hand, and the += accumulation they all promise.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include "test/reference/kernels_ref.h"
#include "test/reference/optim_ref.h"
#include "test/support/finite_diff.h"

namespace {

using llmc_test::dot;
using llmc_test::finite_difference;
using llmc_test::kFdStep;
using llmc_test::kFdTolerance;
using llmc_test::random_vector;

// ---------------------------------------------------------------------------------------------------------------
TEST(LayerNormRef, ForwardNormalises) {
  std::mt19937 rng(1);
  const int N = 3, C = 64;
  std::vector<float> inp = random_vector(N * C, rng, -3.0f, 5.0f), weight(C, 1.0f), bias(C, 0.0f), out(N * C);
  std::vector<float> mean(N), rstd(N);
  llmc::layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  for (int n = 0; n < N; n++) {
    double m = 0.0, sq = 0.0, in_mean = 0.0;
    for (int c = 0; c < C; c++) {
      m += out[n * C + c];
      sq += out[n * C + c] * out[n * C + c];
      in_mean += inp[n * C + c];
    }
    EXPECT_NEAR(m / C, 0.0, 1e-6);
    EXPECT_NEAR(sq / C, 1.0, 1e-3);  // 1 - eps * rstd^2: the eps = 1e-5 in the variance
    EXPECT_NEAR(mean[n], in_mean / C, 1e-5);
  }
}

// L = sum(out * R): dout = R; compare dinp, dweight, dbias with finite differences of L.
TEST(LayerNormRef, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  const int N = 3, C = 16;
  std::vector<float> inp = random_vector(N * C, rng, -2.0f, 2.0f), weight = random_vector(C, rng, 0.5f, 1.5f),
                     bias = random_vector(C, rng), R = random_vector(N * C, rng);
  auto loss = [&](const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b) {
    std::vector<float> out(N * C);
    llmc::layernorm_forward_cpu(out.data(), nullptr, nullptr, x.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  std::vector<float> out(N * C), mean(N), rstd(N);
  llmc::layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  // Pre-filled gradients: the reference must add to them.
  const float dinp0 = 0.25f, dweight0 = -0.5f, dbias0 = 0.75f;
  std::vector<float> dinp(N * C, dinp0), dweight(C, dweight0), dbias(C, dbias0);
  llmc::layernorm_backward_cpu(dinp.data(), dweight.data(), dbias.data(), R.data(), inp.data(), weight.data(),
                               mean.data(), rstd.data(), N, C);

  auto current_loss = [&] { return loss(inp, weight, bias); };
  for (size_t i = 0; i < inp.size(); i++)
    EXPECT_NEAR(dinp[i] - dinp0, finite_difference(inp, i, current_loss), kFdTolerance) << "dinp[" << i << "]";
  for (int c = 0; c < C; c++) {
    EXPECT_NEAR(dweight[c] - dweight0, finite_difference(weight, c, current_loss), kFdTolerance)
        << "dweight[" << c << "]";
    EXPECT_NEAR(dbias[c] - dbias0, finite_difference(bias, c, current_loss), kFdTolerance) << "dbias[" << c << "]";
  }
}

// ---------------------------------------------------------------------------------------------------------------
TEST(GeluRef, ForwardKnownValues) {
  const std::vector<float> x = {0.0f, 1.0f, -1.0f, 3.0f};
  std::vector<float> y(x.size());
  llmc::gelu_forward_cpu(y.data(), x.data(), x.size());
  // torch.nn.functional.gelu(x, approximate="tanh")
  EXPECT_FLOAT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 0.8411920070648193, 1e-6);
  EXPECT_NEAR(y[2], -0.15880800783634186, 1e-6);
  EXPECT_NEAR(y[3], 2.9963626861572266, 1e-6);
}

TEST(GeluRef, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  const size_t n = 37;
  std::vector<float> x = random_vector(n, rng, -4.0f, 4.0f), dout = random_vector(n, rng);
  std::vector<float> dinout = dout;
  llmc::gelu_backward_inplace_cpu(dinout.data(), x.data(), n);
  for (size_t i = 0; i < n; i++) {
    float plus, minus;
    const float xp = x[i] + kFdStep, xm = x[i] - kFdStep;
    llmc::gelu_forward_cpu(&plus, &xp, 1);
    llmc::gelu_forward_cpu(&minus, &xm, 1);
    const double derivative = (static_cast<double>(plus) - minus) / (2.0 * kFdStep);
    EXPECT_NEAR(dinout[i], dout[i] * derivative, kFdTolerance) << "x = " << x[i];
  }
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ClassifierRef, UniformLogitsGiveLogV) {
  const int N = 2, V = 10, Vp = 16;
  std::vector<float> logits(N * Vp, 0.0f), losses(N);
  const std::vector<int> targets = {3, 9};
  llmc::fused_classifier_cpu(logits.data(), losses.data(), targets.data(), N, V, Vp, 1.0f, false);
  EXPECT_NEAR(losses[0], std::log(10.0), 1e-6);
  EXPECT_NEAR(losses[1], std::log(10.0), 1e-6);
}

// dlogits = dloss * d(loss[n]) / d(logits[n, :]); padding columns and ignored rows get 0, ignored rows lose 0.
TEST(ClassifierRef, DlogitsMatchFiniteDifferences) {
  std::mt19937 rng(4);
  const int N = 4, V = 11, Vp = 16;
  const float dloss = 0.37f;
  std::vector<float> logits = random_vector(N * Vp, rng, -3.0f, 3.0f);
  const std::vector<int> targets = {0, 10, -1, 5};
  for (int n = 0; n < N; n++)
    for (int c = V; c < Vp; c++) logits[n * Vp + c] = NAN;  // padding must never be read
  std::vector<float> dlogits = logits, losses(N);
  llmc::fused_classifier_cpu(dlogits.data(), losses.data(), targets.data(), N, V, Vp, dloss, true);
  EXPECT_EQ(losses[2], 0.0f);

  auto row_loss = [&](int n) {
    std::vector<float> row(logits.begin() + n * Vp, logits.begin() + (n + 1) * Vp);
    float loss;
    llmc::fused_classifier_cpu(row.data(), &loss, &targets[n], 1, V, Vp, dloss, false);
    return static_cast<double>(loss);
  };
  for (int n = 0; n < N; n++) {
    if (targets[n] >= 0) EXPECT_NEAR(losses[n], row_loss(n), 1e-6);
    for (int c = 0; c < Vp; c++) {
      const float got = dlogits[n * Vp + c];
      if (c >= V || targets[n] < 0) {
        EXPECT_EQ(got, 0.0f) << "row " << n << " column " << c;
        continue;
      }
      const float saved = logits[n * Vp + c];
      logits[n * Vp + c] = saved + kFdStep;
      const double plus = row_loss(n);
      logits[n * Vp + c] = saved - kFdStep;
      const double minus = row_loss(n);
      logits[n * Vp + c] = saved;
      EXPECT_NEAR(got, dloss * (plus - minus) / (2.0 * kFdStep), kFdTolerance * dloss) << "row " << n << " col " << c;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
TEST(EncoderRef, ForwardAddsTokenAndPosition) {
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<float> wte(V * C), wpe(T * C), out(B * T * C);
  for (int i = 0; i < V * C; i++) wte[i] = static_cast<float>(i);
  for (int i = 0; i < T * C; i++) wpe[i] = 1000.0f * i;
  const std::vector<int> tokens = {4, 0, 4, 1, 1, 2};
  llmc::encoder_forward_cpu(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++)
        EXPECT_EQ(out[(b * T + t) * C + c], wte[tokens[b * T + t] * C + c] + wpe[t * C + c]);
}

TEST(EncoderRef, BackwardMatchesNaiveLoop) {
  std::mt19937 rng(5);
  const int B = 3, T = 7, C = 8, Vp = 13;
  std::vector<int> tokens(B * T);
  std::uniform_int_distribution<int> token_dist(0, 5);  // few distinct tokens: many repeats
  for (int& t : tokens) t = token_dist(rng);
  tokens[4] = Vp - 1;
  const std::vector<float> dout = random_vector(B * T * C, rng);
  std::vector<float> dwte = random_vector(Vp * C, rng), dwpe = random_vector(T * C, rng);
  std::vector<double> naive_wte(dwte.begin(), dwte.end()), naive_wpe(dwpe.begin(), dwpe.end());
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        naive_wte[tokens[b * T + t] * C + c] += dout[(b * T + t) * C + c];
        naive_wpe[t * C + c] += dout[(b * T + t) * C + c];
      }
  llmc::encoder_backward_cpu(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  for (int i = 0; i < Vp * C; i++) EXPECT_NEAR(dwte[i], naive_wte[i], 1e-5) << "dwte[" << i << "]";
  for (int i = 0; i < T * C; i++) EXPECT_NEAR(dwpe[i], naive_wpe[i], 1e-5) << "dwpe[" << i << "]";
}

// ---------------------------------------------------------------------------------------------------------------
TEST(ReduceRef, BiasBackwardAccumulatesColumnSums) {
  const int N = 3, OC = 2;
  const std::vector<float> dout = {1, 2, 3, 4, 5, 6};
  std::vector<float> dbias = {10, 20};
  llmc::bias_backward_cpu(dbias.data(), dout.data(), N, OC);
  EXPECT_EQ(dbias[0], 10.0f + 1 + 3 + 5);
  EXPECT_EQ(dbias[1], 20.0f + 2 + 4 + 6);
}

TEST(ReduceRef, GlobalNorm) {
  const std::vector<float> v = {3.0f, -4.0f, 12.0f};
  EXPECT_DOUBLE_EQ(llmc::global_norm_cpu(v.data(), v.size()), 13.0);
}

// ---------------------------------------------------------------------------------------------------------------
// Two AdamW steps computed by hand in FP64 from the documented formulas.
TEST(AdamWRef, MatchesHandComputedSteps) {
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
  std::vector<float> master = {1.0f, -2.0f, 0.5f}, m(3, 0.0f), v(3, 0.0f), params(3);
  const std::vector<float> grads1 = {0.2f, -0.4f, 0.0f}, grads2 = {-0.1f, 0.3f, 1.0f};
  std::vector<double> hm(3, 0.0), hv(3, 0.0), hmaster(master.begin(), master.end());
  for (int t = 1; t <= 2; t++) {
    const std::vector<float>& grads = t == 1 ? grads1 : grads2;
    llmc::adamw_update_cpu(master.data(), params.data(), grads.data(), m.data(), v.data(), 3, lr, beta1, beta2, eps,
                           wd, t, grad_scale);
    for (int i = 0; i < 3; i++) {
      const double g = static_cast<double>(grads[i]) * grad_scale;
      hm[i] = beta1 * hm[i] + (1.0 - beta1) * g;
      hv[i] = beta2 * hv[i] + (1.0 - beta2) * g * g;
      const double mhat = hm[i] / (1.0 - std::pow(static_cast<double>(beta1), t));
      const double vhat = hv[i] / (1.0 - std::pow(static_cast<double>(beta2), t));
      hmaster[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * hmaster[i]);
      EXPECT_NEAR(m[i], hm[i], 1e-6 * std::fabs(hm[i]) + 1e-12) << "t " << t << " i " << i;
      EXPECT_NEAR(v[i], hv[i], 1e-6 * std::fabs(hv[i]) + 1e-12) << "t " << t << " i " << i;
      EXPECT_NEAR(master[i], hmaster[i], 1e-6) << "t " << t << " i " << i;
      EXPECT_EQ(params[i], static_cast<float>(__bfloat162float(__float2bfloat16_rn(master[i]))));
    }
  }
}

// Step 1 by inspection: mhat = g, vhat = g^2, so a parameter moves by lr * (sign(g) + wd * master) (up to eps), and
// a zero gradient leaves only the decay.
TEST(AdamWRef, FirstStepMovesBySignOfGradient) {
  std::vector<float> master = {1.0f, -2.0f, 0.5f}, m(3, 0.0f), v(3, 0.0f), params(3);
  const std::vector<float> grads = {0.2f, -0.4f, 0.0f};
  llmc::adamw_update_cpu(master.data(), params.data(), grads.data(), m.data(), v.data(), 3, 0.01f, 0.9f, 0.95f, 1e-8f,
                         0.1f, 1, 1.0f);
  EXPECT_NEAR(master[0], 1.0 - 0.01 * (1.0 + 0.1 * 1.0), 1e-6);
  EXPECT_NEAR(master[1], -2.0 - 0.01 * (-1.0 + 0.1 * -2.0), 1e-6);
  EXPECT_NEAR(master[2], 0.5 - 0.01 * (0.1 * 0.5), 1e-7);
}

// The bf16 copy is round-to-nearest-even: exact ties go to the even mantissa.
TEST(AdamWRef, ParamsRoundToNearestEven) {
  std::vector<float> master = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -(1.0f + 0x1p-8f)};
  std::vector<float> m(4, 0.0f), v(4, 0.0f), grads(4, 0.0f), params(4);
  // lr = 0: the master stays as is and only the rounding is exercised.
  llmc::adamw_update_cpu(master.data(), params.data(), grads.data(), m.data(), v.data(), 4, 0.0f, 0.9f, 0.95f, 1e-8f,
                         0.0f, 1, 1.0f);
  EXPECT_EQ(params[0], 1.0f);
  EXPECT_EQ(params[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(params[2], 1.0f + 0x1p-7f);
  EXPECT_EQ(params[3], -1.0f);
}

}  // namespace
