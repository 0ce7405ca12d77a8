// test/optim/test_schedule: learning-rate values at known steps for every schedule (warm-up, mid-decay, last step,
// past the end), and the argument errors.
#include <gtest/gtest.h>

#include <string>

#include "llmc/core/common.h"
#include "llmc/optim/schedule.h"

using llmc::learning_rate;

namespace {
constexpr double kMaxLr = 1.0;
constexpr double kFinalFrac = 0.1;
constexpr double kTol = 1e-12;
}  // namespace

TEST(Schedule, WarmupIsLinearFromMaxOverWarmup) {
  for (const std::string& s : llmc::schedule_names()) {
    EXPECT_NEAR(learning_rate(s, 0, 100, 10, kMaxLr, kFinalFrac, 0.2), 0.1, kTol) << s;
    EXPECT_NEAR(learning_rate(s, 4, 100, 10, kMaxLr, kFinalFrac, 0.2), 0.5, kTol) << s;
    EXPECT_NEAR(learning_rate(s, 9, 100, 10, kMaxLr, kFinalFrac, 0.2), 1.0, kTol) << s;
  }
  // Warm-up longer than the run: still the warm-up ramp.
  EXPECT_NEAR(learning_rate("cosine", 4, 5, 10, 2.0, kFinalFrac, 0.2), 1.0, kTol);
}

TEST(Schedule, CosineDecaysToFinalAtLastStep) {
  // total 111, warmup 10: decay runs over steps 10..110, r = (step - 10) / 100.
  EXPECT_NEAR(learning_rate("cosine", 10, 111, 10, kMaxLr, kFinalFrac, 0), 1.0, kTol);
  EXPECT_NEAR(learning_rate("cosine", 35, 111, 10, kMaxLr, kFinalFrac, 0), 0.8681980515339464, kTol);
  EXPECT_NEAR(learning_rate("cosine", 60, 111, 10, kMaxLr, kFinalFrac, 0), 0.55, kTol);
  EXPECT_NEAR(learning_rate("cosine", 110, 111, 10, kMaxLr, kFinalFrac, 0), 0.1, kTol);
  EXPECT_NEAR(learning_rate("cosine", 500, 111, 10, kMaxLr, kFinalFrac, 0), 0.1, kTol);  // past the end
  EXPECT_NEAR(learning_rate("cosine", 99, 100, 0, 6e-4, 0.0, 0), 0.0, kTol);              // decay to zero
  EXPECT_NEAR(learning_rate("cosine", 0, 100, 0, 6e-4, 0.0, 0), 6e-4, kTol);              // no warm-up
}

TEST(Schedule, LinearDecaysToFinalAtLastStep) {
  EXPECT_NEAR(learning_rate("linear", 10, 111, 10, kMaxLr, kFinalFrac, 0), 1.0, kTol);
  EXPECT_NEAR(learning_rate("linear", 35, 111, 10, kMaxLr, kFinalFrac, 0), 0.775, kTol);
  EXPECT_NEAR(learning_rate("linear", 60, 111, 10, kMaxLr, kFinalFrac, 0), 0.55, kTol);
  EXPECT_NEAR(learning_rate("linear", 110, 111, 10, kMaxLr, kFinalFrac, 0), 0.1, kTol);
}

TEST(Schedule, ConstantAfterWarmup) {
  EXPECT_NEAR(learning_rate("constant", 10, 100, 10, 3e-4, kFinalFrac, 0), 3e-4, kTol);
  EXPECT_NEAR(learning_rate("constant", 99, 100, 10, 3e-4, kFinalFrac, 0), 3e-4, kTol);
}

TEST(Schedule, WsdStableThenOneMinusSqrtDecay) {
  // total 100, decay frac 0.2: stable through step 79, decay over steps 80..99, r = (step - 80) / 19.
  EXPECT_NEAR(learning_rate("wsd", 50, 100, 10, kMaxLr, kFinalFrac, 0.2), 1.0, kTol);
  EXPECT_NEAR(learning_rate("wsd", 79, 100, 10, kMaxLr, kFinalFrac, 0.2), 1.0, kTol);
  EXPECT_NEAR(learning_rate("wsd", 80, 100, 10, kMaxLr, kFinalFrac, 0.2), 1.0, kTol);
  EXPECT_NEAR(learning_rate("wsd", 89, 100, 10, kMaxLr, kFinalFrac, 0.2), 0.3805775185494833, kTol);
  EXPECT_NEAR(learning_rate("wsd", 99, 100, 10, kMaxLr, kFinalFrac, 0.2), 0.1, kTol);
  // Decay fraction 0: never decays; decay longer than the post-warm-up part starts right after warm-up.
  EXPECT_NEAR(learning_rate("wsd", 99, 100, 10, kMaxLr, kFinalFrac, 0.0), 1.0, kTol);
  EXPECT_NEAR(learning_rate("wsd", 10, 21, 10, kMaxLr, kFinalFrac, 1.0), 1.0, kTol);
  EXPECT_NEAR(learning_rate("wsd", 15, 21, 10, kMaxLr, kFinalFrac, 1.0), 0.36360389693210715, kTol);
}

TEST(Schedule, SchedulesAreMonotoneAfterWarmup) {
  for (const std::string& s : llmc::schedule_names()) {
    double previous = learning_rate(s, 20, 1000, 20, kMaxLr, kFinalFrac, 0.3);
    for (int step = 21; step < 1000; step++) {
      double lr = learning_rate(s, step, 1000, 20, kMaxLr, kFinalFrac, 0.3);
      ASSERT_LE(lr, previous + kTol) << s << " step " << step;
      ASSERT_GE(lr, kFinalFrac * kMaxLr - kTol) << s << " step " << step;
      previous = lr;
    }
  }
}

TEST(Schedule, BadArgumentsAreErrors) {
  try {
    learning_rate("exponential", 0, 10, 0, 1.0, 0.1, 0.2);
    FAIL();
  } catch (const llmc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exponential"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("train.schedule"), std::string::npos);
  }
  EXPECT_THROW(learning_rate("cosine", 0, 0, 0, 1.0, 0.1, 0.2), llmc::Error);
  EXPECT_THROW(learning_rate("cosine", 0, 10, -1, 1.0, 0.1, 0.2), llmc::Error);
  EXPECT_THROW(learning_rate("cosine", -1, 10, 0, 1.0, 0.1, 0.2), llmc::Error);
  EXPECT_THROW(learning_rate("cosine", 0, 10, 0, 1.0, 1.5, 0.2), llmc::Error);
  EXPECT_THROW(learning_rate("wsd", 0, 10, 0, 1.0, 0.1, -0.1), llmc::Error);
}
