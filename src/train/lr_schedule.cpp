#include "lockstep/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::train {

LrSchedule::LrSchedule(LrScheduleOptions options, int64_t total_steps)
    : options_(std::move(options)), total_steps_(total_steps) {
  LOCKSTEP_CHECK_ARG(options_.lr_ > 0, "lr schedule: lr = ", options_.lr_, " must be > 0");
  LOCKSTEP_CHECK_ARG(options_.warmup_steps_ >= 0, "lr schedule: warmup_steps = ", options_.warmup_steps_,
                     " must be >= 0");
  LOCKSTEP_CHECK_ARG(options_.decay_ == "constant" || options_.decay_ == "cosine", "lr schedule: decay '",
                     options_.decay_, "' is not one of constant, cosine");
  LOCKSTEP_CHECK_ARG(options_.final_ratio_ >= 0 && options_.final_ratio_ <= 1,
                     "lr schedule: final_ratio = ", options_.final_ratio_, " must lie in [0, 1]");
  LOCKSTEP_CHECK_ARG(total_steps_ >= 1, "lr schedule: total_steps = ", total_steps_, " must be >= 1");
}

double LrSchedule::at(int64_t step) const {
  const double lr = options_.lr_;
  const int64_t warmup = options_.warmup_steps_;
  if (step <= warmup) return lr * static_cast<double>(std::max<int64_t>(step, 1)) / static_cast<double>(warmup);
  if (options_.decay_ == "constant") return lr;
  // Cosine from the first step after the warm-up (lr) to the last step (lr * final_ratio).
  const int64_t span = total_steps_ - warmup;
  const double progress =
      span <= 1 ? 1.0 : std::min(1.0, static_cast<double>(step - warmup - 1) / static_cast<double>(span - 1));
  const double r = options_.final_ratio_;
  return lr * (r + (1 - r) * 0.5 * (1 + std::cos(M_PI * progress)));
}

}  // namespace lockstep::train
