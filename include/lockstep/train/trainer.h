// Training an autoencoder on Fashion-MNIST or an image folder into a run directory: the resolved
// config, metrics, checkpoints, a reconstruction grid (and the folder's manifest). A run interrupted at step k and
// resumed reaches bit for bit the parameters an uninterrupted run has at every later step.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/dist/group.h"
#include "lockstep/train/config.h"
#include "lockstep/train/evaluate.h"
#include "lockstep/train/resolve_run.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::train {

// The loss of a step was not finite (nan or inf). Thrown on every rank at the same step, before
// that step changes the parameters; the run directory keeps its last checkpoint.
class TrainingDiverged : public Error {
 public:
  using Error::Error;
};

struct StepReport {
  int64_t step = 0;  // steps completed
  int64_t total_steps = 0;
  int64_t epoch = 0;  // 0-based epoch of the step just taken
  int64_t epochs = 0;
  double loss = 0;
  double images_per_s = 0;  // over the last logging window
  double elapsed_s = 0;     // in this process
  int64_t image_width = 0;  // the step's images (its bucket, for an image folder)
  int64_t image_height = 0;
};

struct TrainCallbacks {
  std::function<void(const StepReport&)> on_step;   // after every step
  std::function<void(const std::string&)> on_info;  // notable events (checkpoint, resume)
  std::function<void(int64_t step, const EvalResult&)> on_eval;
  // Read during every step and summed over the ranks with its gradients: once it is true on any
  // rank, every rank finishes that step, saves a checkpoint and returns.
  const std::atomic<bool>* stop_requested = nullptr;
};

struct TrainSummary {
  std::string run_dir;
  int64_t steps = 0;         // steps completed in total
  bool interrupted = false;  // stopped by stop_requested before the last step
  // Every step was taken, but stop_requested came before or during the final evaluation, which was
  // skipped: the run is complete, without test figures (`lockstep eval` gives them).
  bool evaluation_skipped = false;
  double seconds = 0;              // wall time in this process
  EvalResult test;                 // final evaluation (absent when interrupted)
  EvalResult test_weight_average;  // the same for the weights' moving average (train.ema_decay > 0)
};

class Trainer {
 public:
  // Progress of the work before the first step (scanning an image folder, what the data is).
  using InfoCallback = std::function<void(const std::string&)>;

  // A new run in `run_dir`, which must not already hold one; it is created if needed. `run`: as
  // resolve_new_run makes it (the CLI resolves once, before the process group, for the device).
  static std::unique_ptr<Trainer> create(ResolvedRun run, const std::string& run_dir,
                                         std::shared_ptr<dist::Group> group, const InfoCallback& on_info = {});
  // The same from a whole configuration (every key), its settings read from it.
  static std::unique_ptr<Trainer> create(const Config& config, const std::string& run_dir,
                                         std::shared_ptr<dist::Group> group, const InfoCallback& on_info = {});
  // Continues the run in `run_dir` from its checkpoint, as resolve_resumed_run(run_dir, overrides)
  // resolves it: overrides ("key=value") may change only keys that do not alter the model or the data
  // order (see resumable_keys()). A run that stopped before its first checkpoint starts again from
  // step 0 with its config.toml and the overrides (on_info says so), so that `--resume` is always the way on.
  static std::unique_ptr<Trainer> resume(const std::string& run_dir, const std::vector<std::string>& overrides,
                                         std::shared_ptr<dist::Group> group, const InfoCallback& on_info = {});
  // The same with the run already resolved (the CLI's, once); `overridden`: whether overrides were given.
  static std::unique_ptr<Trainer> resume(const std::string& run_dir, ResolvedRun run, bool overridden,
                                         std::shared_ptr<dist::Group> group, const InfoCallback& on_info = {});
  static const std::vector<std::string>& resumable_keys();

  ~Trainer();
  TrainSummary run(const TrainCallbacks& callbacks);
  // What config.toml and the checkpoint record: the configuration with what the data decided (recorded_config).
  const Config& config() const;
  // The resolved settings (data.dataset chosen), with what the data decided: train.batch_size is the global
  // batch each step takes (a small image folder's fitted one), as config() records it.
  const RunSettings& settings() const;
  int64_t step() const;

 private:
  struct State;
  explicit Trainer(std::unique_ptr<State> state);
  // A run from step 0 in s's run directory, whose lock s already holds (on rank 0).
  static std::unique_ptr<Trainer> start_from_scratch(std::unique_ptr<State> s, const InfoCallback& on_info);
  std::unique_ptr<State> s_;
};

}  // namespace lockstep::train
