// What a training run tells as it goes, kept out of the step itself: the per-step report for the
// caller, metrics.jsonl (rank 0 writes it: train lines every train.log_every steps, an epoch line
// at each epoch's end, eval lines), and the end-of-epoch message. Internal to src/train.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/train/metrics.h"
#include "lockstep/train/trainer.h"
#include "run_plan.h"

namespace lockstep::train {

// One step as the reports need it.
struct StepFacts {
  double loss = 0;          // the global batch's loss
  int64_t replaced = 0;     // images replaced on every rank (failed to decode)
  double waited_s = 0;      // this rank's wait for the loader
  int64_t image_width = 0;  // the step's bucket
  int64_t image_height = 0;
  double grad_norm = 0;           // the global gradient norm before clipping (on logged steps, or when clipping)
  double lr = 0;                  // the step's learning rate
  bool adversary = false;         // the run trains a discriminator: the two figures below are logged
  double disc_loss = 0;           // its loss this step (0 before loss.gan_start_step)
  double adversarial_factor = 0;  // the adversarial loss's weight this step (adaptive, or loss.adversarial)
};

class RunReport {
 public:
  // `metrics_file` empty: this rank writes no metrics (ranks other than 0). `first_step`: the step
  // the run starts or resumes at (later lines in the file are dropped). A train line every `log_every` steps.
  RunReport(const std::string& metrics_file, int64_t first_step, const RunPlan& plan, int64_t log_every,
            const TrainCallbacks& callbacks, bool root);

  // After step `step` (1-based, completed); `unreadable`: files the data leaves out.
  void after_step(int64_t step, const StepFacts& facts, int64_t unreadable);
  void after_eval(int64_t step, const EvalResult& result);
  double elapsed_s() const;
  // Whether step `step` (1-based) gets a line of training metrics.
  bool logs(int64_t step) const { return step % log_every_ == 0 || step == plan_.total_steps; }

 private:
  using Clock = std::chrono::steady_clock;
  std::optional<MetricsLog> metrics_;
  RunPlan plan_;
  int64_t log_every_;
  const TrainCallbacks& callbacks_;
  bool root_;
  int64_t epochs_;
  Clock::time_point start_ = Clock::now(), window_start_ = Clock::now();
  double window_loss_ = 0, window_wait_ = 0, epoch_wait_ = 0;
  int64_t window_steps_ = 0, epoch_replaced_ = 0;
};

}  // namespace lockstep::train
