// test/optim/test_state_format_error.cpp: llmc/optim/state_format_error (COAT's Table 1 metric, run on checkpoints by
// dev/tools/state_error) on synthetic moments: fp32 loses nothing; bf16 stays inside its rounding bound; every
// fp8_expand group reports its k, inside the clamp; on groups spanning two decades (COAT's m) the expansion loses less
// than plain per-group FP8; the numbers do not depend on the thread count; bad arguments are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/optim/state_format_error.h"

using llmc::AdamWStepShape;
using llmc::StateFormat;
using llmc::StateFormatError;

namespace {

// n moments whose magnitudes are log-uniform over `decades` inside every group of 128, random signs for m, v of the
// size of m^2 (as after a few steps of AdamW), a run of exact zeros, and n not a multiple of 128 (a partial last group).
struct Moments {
  std::vector<float> m, v;
  explicit Moments(size_t n, double decades = 2.0, uint32_t seed = 7) : m(n), v(n) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<double> e(-decades, 0.0), sign(-1.0, 1.0), scale(-6.0, -2.0);
    double group_scale = 1.0;
    for (size_t i = 0; i < n; i++) {
      if (i % 128 == 0) group_scale = std::pow(10.0, scale(gen));
      const double mag = group_scale * std::pow(10.0, e(gen));
      m[i] = static_cast<float>(sign(gen) < 0 ? -mag : mag);
      v[i] = static_cast<float>(mag * mag * std::pow(10.0, 0.5 * e(gen) / decades));
    }
    for (size_t i = 300; i < 420 && i < n; i++) m[i] = v[i] = 0.0f;
  }
};

constexpr size_t kN = 128 * 61 + 37;
const AdamWStepShape kShape{0.9, 0.95, 1e-8, 400};

}  // namespace

TEST(StateFormatError, Fp32LosesNothing) {
  const Moments x(kN);
  const StateFormatError e = llmc::state_format_error(StateFormat::fp32(), x.m.data(), x.v.data(), kN, kShape, 3);
  EXPECT_EQ(e.m_rel_l2, 0.0);
  EXPECT_EQ(e.v_rel_l2, 0.0);
  EXPECT_EQ(e.u_rel_l2, 0.0);
  EXPECT_EQ(e.u_mse, 0.0);
  EXPECT_EQ(e.m_lost, 0.0);
  EXPECT_TRUE(e.k_m.empty() && e.k_v.empty());
}

TEST(StateFormatError, Bf16StaysInsideItsRoundingBound) {
  const Moments x(kN);
  const StateFormatError e = llmc::state_format_error(StateFormat::bf16(), x.m.data(), x.v.data(), kN, kShape, 2);
  const double half_ulp = std::ldexp(1.0, -9);  // round to nearest even with 8 significant bits
  EXPECT_GT(e.m_rel_l2, 0.0);
  EXPECT_LE(e.m_rel_l2, half_ulp);
  EXPECT_LE(e.v_rel_l2, half_ulp);
  EXPECT_LE(e.u_rel_l2, 2 * half_ulp);  // u ~ m / sqrt(v): at most m's error plus half of v's, to first order
  EXPECT_EQ(e.m_lost, 0.0);
}

TEST(StateFormatError, ExpansionReportsEveryGroupsKAndLosesLessThanPlainFp8) {
  const Moments x(kN);
  const StateFormatError plain =
      llmc::state_format_error(StateFormat::fp8(), x.m.data(), x.v.data(), kN, kShape, 4);
  const StateFormatError expand =
      llmc::state_format_error(StateFormat::fp8_expand(), x.m.data(), x.v.data(), kN, kShape, 4);
  EXPECT_TRUE(plain.k_m.empty());
  const size_t groups = (kN + 127) / 128;
  ASSERT_EQ(expand.k_m.size(), groups);
  ASSERT_EQ(expand.k_v.size(), groups);
  for (size_t g = 0; g < groups; g++) {
    EXPECT_GE(expand.k_m[g], 0.5f) << g;
    EXPECT_LE(expand.k_m[g], 8.0f) << g;
    EXPECT_GE(expand.k_v[g], 0.5f) << g;
    EXPECT_LE(expand.k_v[g], 8.0f) << g;
  }
  EXPECT_GT(expand.k_m[0], 1.0f);  // two decades of E4M3's five: the group is expanded
  EXPECT_GT(plain.m_rel_l2, 0.0);
  EXPECT_LT(expand.m_rel_l2, plain.m_rel_l2);
  EXPECT_LT(expand.v_rel_l2, plain.v_rel_l2);
  EXPECT_LT(expand.u_mse, plain.u_mse);
  EXPECT_LT(plain.m_rel_l2, 0.1);  // E4M3 keeps 3 mantissa bits: a few percent, not more
}

TEST(StateFormatError, TheThreadCountChangesNothing) {
  const Moments x(kN);
  for (const StateFormat& format : llmc::state_formats()) {
    SCOPED_TRACE(format.name);
    const StateFormatError one = llmc::state_format_error(format, x.m.data(), x.v.data(), kN, kShape, 1);
    for (int threads : {2, 3, 7, 64}) {
      const StateFormatError many = llmc::state_format_error(format, x.m.data(), x.v.data(), kN, kShape, threads);
      EXPECT_EQ(many.m_rel_l2, one.m_rel_l2) << threads;
      EXPECT_EQ(many.v_rel_l2, one.v_rel_l2) << threads;
      EXPECT_EQ(many.u_mse, one.u_mse) << threads;
      EXPECT_EQ(many.k_m, one.k_m) << threads;
      EXPECT_EQ(many.k_v, one.k_v) << threads;
    }
  }
}

TEST(StateFormatError, AllZeroMomentsAndBadArguments) {
  const std::vector<float> zeros(300, 0.0f);
  const StateFormatError e =
      llmc::state_format_error(StateFormat::fp8_expand(), zeros.data(), zeros.data(), zeros.size(), kShape, 2);
  EXPECT_EQ(e.m_rel_l2, 0.0);
  EXPECT_EQ(e.u_rel_l2, 0.0);
  EXPECT_EQ(e.m_lost, 0.0);
  EXPECT_THROW(llmc::state_format_error(StateFormat::fp8(), zeros.data(), zeros.data(), zeros.size(), kShape, 0),
               llmc::Error);
  AdamWStepShape step0 = kShape;
  step0.step = 0;
  EXPECT_THROW(llmc::state_format_error(StateFormat::fp8(), zeros.data(), zeros.data(), zeros.size(), step0, 1),
               llmc::Error);
}
