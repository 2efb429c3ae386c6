#include "lockstep/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {

TEST(LrSchedule, WarmupThenCosineToTheFinalRatioAtTheLastStep) {
  const LrSchedule s(LrScheduleOptions().lr(2.0).warmup_steps(4).decay("cosine").final_ratio(0.1), 12);
  EXPECT_DOUBLE_EQ(s.at(1), 0.5);  // 2 x 1/4
  EXPECT_DOUBLE_EQ(s.at(3), 1.5);
  EXPECT_DOUBLE_EQ(s.at(4), 2.0);
  EXPECT_DOUBLE_EQ(s.at(5), 2.0);  // the first decayed step starts at the top of the cosine
  // Step 8 is 3 of the 7 intervals from step 5 to step 12.
  EXPECT_DOUBLE_EQ(s.at(8), 2.0 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 3.0 / 7.0))));
  EXPECT_DOUBLE_EQ(s.at(12), 0.2);
  EXPECT_DOUBLE_EQ(s.at(40), 0.2);  // past the last step, the last rate
  for (int64_t step = 5; step < 12; ++step) EXPECT_GT(s.at(step), s.at(step + 1)) << step;
}

TEST(LrSchedule, ConstantAfterTheWarmupAndWithoutOne) {
  const LrSchedule warm(LrScheduleOptions().lr(1e-3).warmup_steps(10), 100);
  EXPECT_DOUBLE_EQ(warm.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(warm.at(11), 1e-3);
  EXPECT_DOUBLE_EQ(warm.at(100), 1e-3);
  const LrSchedule plain(LrScheduleOptions().lr(1e-3), 100);
  EXPECT_DOUBLE_EQ(plain.at(1), 1e-3);
  // Cosine over one remaining step, or a warm-up as long as the run, ends at the final rate / lr.
  EXPECT_DOUBLE_EQ(LrSchedule(LrScheduleOptions().lr(1).decay("cosine").final_ratio(0.5), 1).at(1), 0.5);
  EXPECT_DOUBLE_EQ(LrSchedule(LrScheduleOptions().lr(1).warmup_steps(6).decay("cosine"), 6).at(6), 1.0);
}

TEST(LrSchedule, InvalidOptionsNameTheValue) {
  auto message = [](const LrScheduleOptions& o, int64_t total) {
    try {
      LrSchedule(o, total);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(LrScheduleOptions().lr(0), 10).find("lr = 0"), std::string::npos);
  EXPECT_NE(message(LrScheduleOptions().warmup_steps(-1), 10).find("warmup_steps = -1"), std::string::npos);
  EXPECT_NE(message(LrScheduleOptions().decay("linear"), 10).find("'linear'"), std::string::npos);
  EXPECT_NE(message(LrScheduleOptions().final_ratio(1.5), 10).find("final_ratio = 1.5"), std::string::npos);
  EXPECT_NE(message(LrScheduleOptions(), 0).find("total_steps = 0"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::train
