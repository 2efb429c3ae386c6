// The learning rate of each optimizer step: linear warm-up, then constant or cosine decay, as the
// published tokenizer trainers schedule it. A pure function of the step, so every rank and a resumed
// run use the same rate without storing or exchanging anything.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::train {

struct LrScheduleOptions {
  LrScheduleOptions& lr(double v) {
    lr_ = v;
    return *this;
  }
  // Steps 1..warmup_steps ramp linearly: step s (1-based) uses lr * s / warmup_steps.
  LrScheduleOptions& warmup_steps(int64_t n) {
    warmup_steps_ = n;
    return *this;
  }
  // "constant" or "cosine": after the warm-up, cosine goes from lr down to lr * final_ratio at the
  // last step, half a cosine period over the remaining steps.
  LrScheduleOptions& decay(std::string name) {
    decay_ = std::move(name);
    return *this;
  }
  LrScheduleOptions& final_ratio(double r) {
    final_ratio_ = r;
    return *this;
  }
  double lr_ = 1e-3;
  int64_t warmup_steps_ = 0;
  std::string decay_ = "constant";
  double final_ratio_ = 0.1;
};

class LrSchedule {
 public:
  // total_steps: the run's last step. Throws InvalidArgument with the value: lr <= 0, warm-up < 0,
  // an unknown decay, final_ratio outside [0, 1], total_steps < 1.
  LrSchedule(LrScheduleOptions options, int64_t total_steps);
  // The rate of optimizer step `step` (1-based; steps past the last keep the last rate).
  double at(int64_t step) const;

 private:
  LrScheduleOptions options_;
  int64_t total_steps_;
};

}  // namespace lockstep::train
