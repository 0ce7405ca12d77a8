// test/kernels/test_attention_ref.cpp: the CPU attention references (llmc/kernels/attention.cu) that the GPU tests trust.
//   forward  against a naive masked-softmax formula (full (T, T) probability matrix per head)
//   backward against central finite differences of the forward, in double precision, for MHA and GQA shapes
//   float API = double variant rounded; argument validation.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/kernels/attention.h"
#include "test/reference/kernels_ref.h"
#include "test/support/finite_diff.h"

namespace llmc {
// Double-precision variants defined in llmc/kernels/attention.cu for this test (not part of the kernels.h interface).
void attention_forward_cpu_f64(double* out, double* lse, const double* qkv, int B, int T, int NH, int NKV, int HS);
void attention_backward_cpu_f64(double* dqkv, const double* dout, const double* qkv, const double* out,
                                const double* lse, int B, int T, int NH, int NKV, int HS);
}  // namespace llmc

namespace {

struct Shape {
  int B, T, NH, NKV, HS;
  size_t qkv_size() const { return (size_t)B * T * (NH + 2 * NKV) * HS; }
  size_t out_size() const { return (size_t)B * T * NH * HS; }
  size_t lse_size() const { return (size_t)B * NH * T; }
};

std::vector<double> random_vector(size_t n, double stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<double> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// Naive forward: build the full masked score matrix of one head, softmax it row by row, multiply by V.
void naive_forward(std::vector<double>& out, std::vector<double>& lse, const std::vector<double>& qkv, const Shape& s) {
  const int C3 = (s.NH + 2 * s.NKV) * s.HS;
  out.assign(s.out_size(), 0.0);
  lse.assign(s.lse_size(), 0.0);
  for (int b = 0; b < s.B; b++) {
    for (int h = 0; h < s.NH; h++) {
      const int kvh = h / (s.NH / s.NKV);
      auto q = [&](int t, int d) { return qkv[((size_t)b * s.T + t) * C3 + h * s.HS + d]; };
      auto k = [&](int t, int d) { return qkv[((size_t)b * s.T + t) * C3 + (s.NH + kvh) * s.HS + d]; };
      auto v = [&](int t, int d) { return qkv[((size_t)b * s.T + t) * C3 + (s.NH + s.NKV + kvh) * s.HS + d]; };
      std::vector<double> att((size_t)s.T * s.T);  // (T, T)
      for (int t = 0; t < s.T; t++) {
        for (int u = 0; u < s.T; u++) {
          double dot = 0.0;
          for (int d = 0; d < s.HS; d++) dot += q(t, d) * k(u, d);
          att[(size_t)t * s.T + u] = u <= t ? dot / std::sqrt((double)s.HS) : -INFINITY;
        }
        double denom = 0.0;
        for (int u = 0; u < s.T; u++) denom += std::exp(att[(size_t)t * s.T + u]);
        lse[((size_t)b * s.NH + h) * s.T + t] = std::log(denom);
        for (int d = 0; d < s.HS; d++) {
          double acc = 0.0;
          for (int u = 0; u < s.T; u++) acc += std::exp(att[(size_t)t * s.T + u]) / denom * v(u, d);
          out[((size_t)b * s.T + t) * s.NH * s.HS + h * s.HS + d] = acc;
        }
      }
    }
  }
}

const Shape kShapes[] = {
    {1, 1, 1, 1, 4},  // single token: softmax of one score
    {2, 5, 2, 2, 8},  // multi-head
    {1, 6, 4, 2, 8},  // grouped-query, 2 query heads per kv head
    {2, 4, 3, 1, 4},  // multi-query: every head shares one kv head
    {1, 9, 2, 1, 16},
};

TEST(AttentionReference, ForwardMatchesNaiveSoftmax) {
  for (const Shape& s : kShapes) {
    const std::vector<double> qkv = random_vector(s.qkv_size(), 1.5, 1234 + s.T);
    std::vector<double> out(s.out_size()), lse(s.lse_size()), naive_out, naive_lse;
    llmc::attention_forward_cpu_f64(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
    naive_forward(naive_out, naive_lse, qkv, s);
    for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], naive_out[i], 1e-12) << "out[" << i << "] T=" << s.T;
    for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse[i], naive_lse[i], 1e-12) << "lse[" << i << "] T=" << s.T;
  }
}

TEST(AttentionReference, FirstTokenAttendsOnlyToItself) {
  // out[t=0] = v[0] exactly and lse[t=0] = the scaled self-score, whatever the inputs
  const Shape s{1, 3, 2, 1, 4};
  const std::vector<double> qkv = random_vector(s.qkv_size(), 1.0, 7);
  std::vector<double> out(s.out_size()), lse(s.lse_size());
  llmc::attention_forward_cpu_f64(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
  for (int h = 0; h < s.NH; h++) {
    double self = 0.0;
    for (int d = 0; d < s.HS; d++) {
      EXPECT_NEAR(out[h * s.HS + d], qkv[(s.NH + s.NKV) * s.HS + d], 1e-14);
      self += qkv[h * s.HS + d] * qkv[s.NH * s.HS + d];
    }
    EXPECT_NEAR(lse[(size_t)h * s.T], self / 2.0, 1e-14);  // 1/sqrt(4)
  }
}

// L(qkv) = sum(w * out(qkv)); dL/dout = w. Central differences of L against the analytic backward for every element.
TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  for (const Shape& s : kShapes) {
    std::vector<double> qkv = random_vector(s.qkv_size(), 1.5, 99 + s.T);
    const std::vector<double> w = random_vector(s.out_size(), 1.0, 555 + s.T);
    std::vector<double> out(s.out_size()), lse(s.lse_size()), dqkv(s.qkv_size());
    llmc::attention_forward_cpu_f64(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
    llmc::attention_backward_cpu_f64(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.NH, s.NKV,
                                     s.HS);
    auto loss = [&]() {
      std::vector<double> o(s.out_size()), l(s.lse_size());
      llmc::attention_forward_cpu_f64(o.data(), l.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
      double sum = 0.0;
      for (size_t i = 0; i < o.size(); i++) sum += w[i] * o[i];
      return sum;
    };
    const double step = 1e-5;
    double max_grad = 0.0;
    for (double g : dqkv) max_grad = std::max(max_grad, std::fabs(g));
    ASSERT_GT(max_grad, 1e-3) << "degenerate test: all gradients ~0";
    for (size_t i = 0; i < qkv.size(); i++) {
      const double numeric = llmc_test::finite_difference(qkv, i, loss, step);
      // central differences: truncation O(step^2) ~ 1e-10, rounding ~1e-16/step ~ 1e-11
      ASSERT_NEAR(dqkv[i], numeric, 1e-7 * (1.0 + std::fabs(numeric)))
          << "dqkv[" << i << "] B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " HS=" << s.HS;
    }
  }
}

TEST(AttentionReference, FloatApiMatchesDoubleAndOverwrites) {
  const Shape s{2, 7, 4, 2, 8};
  const std::vector<double> qkv = random_vector(s.qkv_size(), 1.0, 42);
  const std::vector<double> dout = random_vector(s.out_size(), 1.0, 43);
  std::vector<double> out(s.out_size()), lse(s.lse_size()), dqkv(s.qkv_size());
  llmc::attention_forward_cpu_f64(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
  llmc::attention_backward_cpu_f64(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.NH,
                                   s.NKV, s.HS);

  std::vector<float> qkv_f(qkv.begin(), qkv.end()), dout_f(dout.begin(), dout.end());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out_f(s.out_size(), nan), lse_f(s.lse_size(), nan), dqkv_f(s.qkv_size(), nan);
  llmc::attention_forward_cpu(out_f.data(), lse_f.data(), qkv_f.data(), s.B, s.T, s.NH, s.NKV, s.HS);
  llmc::attention_backward_cpu(dqkv_f.data(), dout_f.data(), qkv_f.data(), out_f.data(), lse_f.data(), s.B, s.T, s.NH,
                               s.NKV, s.HS);
  // inputs rounded to float: relative perturbation ~6e-8, amplified a little by exp
  for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out_f[i], out[i], 1e-5 * (1 + std::fabs(out[i]))) << i;
  for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse_f[i], lse[i], 1e-5 * (1 + std::fabs(lse[i]))) << i;
  for (size_t i = 0; i < dqkv.size(); i++) ASSERT_NEAR(dqkv_f[i], dqkv[i], 1e-5 * (1 + std::fabs(dqkv[i]))) << i;
}

TEST(AttentionReference, RejectsBadShapes) {
  std::vector<float> buf(1024);
  // n_kv_head must divide n_head
  EXPECT_THROW(llmc::attention_forward_cpu(buf.data(), buf.data(), buf.data(), 1, 2, 3, 2, 4), llmc::Error);
  EXPECT_THROW(llmc::attention_backward_cpu(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), 1, 2, 4, 3, 4),
               llmc::Error);
  EXPECT_THROW(llmc::attention_forward_cpu(buf.data(), buf.data(), buf.data(), 1, 0, 2, 2, 4), llmc::Error);
  // the GPU launchers also reject unsupported head sizes (before touching any pointer)
  EXPECT_THROW(llmc::attention_forward(nullptr, nullptr, nullptr, 1, 2, 2, 2, 96, nullptr), llmc::Error);
  EXPECT_THROW(llmc::attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 2, 4, 3, 64, nullptr),
               llmc::Error);
}

}  // namespace
