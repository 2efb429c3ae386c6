// The trainer's state: what a run holds from its settings to its last step, and the steps that build it
// (trainer_build.cpp: device, data, model, losses) and run it (trainer.cpp). Internal to src/train.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "lockstep/dist/group.h"
#include "lockstep/model/inception.h"
#include "lockstep/model/lpips.h"
#include "lockstep/train/config.h"
#include "lockstep/train/evaluate.h"
#include "lockstep/train/run_dir.h"
#include "lockstep/train/run_settings.h"
#include "lockstep/train/trainer.h"
#include "run_plan.h"
#include "run_report.h"
#include "step_runner.h"
#include "train_data.h"
#include "trained_modules.h"

namespace lockstep::train {

struct Trainer::State {
  // As configured (ResolvedRun::config); once the data is open, what config.toml and the checkpoint record
  // (recorded_config).
  Config config{lockstep_schema()};
  // The resolved settings, typed: what the code below reads. Once the data is open, train.batch_size is the
  // data's global batch (a small folder's fitted one), as plan and config hold it: one batch size.
  RunSettings run;
  std::string run_dir;
  std::unique_ptr<RunDirLock> run_dir_lock;  // rank 0, which writes the run directory
  std::shared_ptr<dist::Group> group;
  std::unique_ptr<TrainData> data;
  TrainedModules modules;              // what the run trains and its checkpoint holds
  std::unique_ptr<StepRunner> runner;  // takes each optimizer step
  model::Lpips lpips{nullptr};         // loss.lpips_weights: the perceptual loss's and evaluation's network
  int64_t lpips_hash = 0;              // of its file, compared across ranks
  model::FidInception fid{nullptr};    // eval.fid_weights, on rank 0 (which evaluates)
  RunPlan plan;                        // device, step shape and totals, once the data is open
  int64_t step = 0;
  int64_t checked_epoch = -1;  // the last epoch whose plan the ranks compared
  int64_t saved_step = -1;     // the step of the checkpoint on disk, -1 before the first

  bool is_root() const { return group->rank() == 0; }
  bool distributed() const { return group->size() > 1; }

  // Every rank must hold rank 0's parameters and buffers (quantizer codebooks included).
  void check_replicas(const char* when);

  // Every rank must train with the same configuration, except keys each may set for itself.
  void check_same_config();

  // Every rank starts from rank 0's parameters and buffers (one checked broadcast).
  void sync_model();

  // Built once, from the settings (trainer_build.cpp). Everything a run needs from its configuration,
  // for both new and resumed runs.
  void build(bool resuming, const std::function<void(const std::string&)>& on_info);

  // The training data; what it decided (a small folder's global batch) goes into the settings, and from
  // them into the run's recorded configuration; then the plan, on `device`.
  void open_data(bool resuming, at::Device device, const std::function<void(const std::string&)>& on_info);

  // The model (on the CPU first: the same initial weights on any device) and its weight average.
  void build_model_and_average();

  // On the CPU, a step that cannot fit in memory is named now, not by a failed allocation later.
  void check_step_fits(const StepLosses& losses) const;

  // The reconstruction terms, the LPIPS network and the adversary, from the loss.* keys.
  StepLosses build_losses(int64_t channels);

  // train.device for this rank; a distributed run's group must carry tensors there (NCCL on CUDA).
  at::Device choose_device(const std::function<void(const std::string&)>& on_info) const;

  // G5: at the start of each epoch the ranks compare (plan hash, steps, data hash) and stop at once
  // if their data differ (another data.dir with other images, say), instead of training on
  // different data or running different numbers of steps.
  void check_plan(int64_t epoch);

  // Whether any rank was asked to stop: one small collective, taken only between steps after a
  // checkpoint or an evaluation (the steps carry the request themselves, with their last bucket).
  bool any_rank_stopping(const std::atomic<bool>* stop_requested);

  void save();

  // The trainer runs the model (or its weight average) over the images the data layer holds for
  // evaluation; EvaluationStopped once `stop` is set (Ctrl-C), when given.
  EvalResult evaluate_test(bool weight_average = false, const std::atomic<bool>* stop = nullptr);

  // The average starts as the model, on every rank after the model's broadcast.
  void start_weight_average();

  // Step `step` + 1 on this rank's part of its global batch; sets `stop` as StepRunner::take does.
  StepFacts take_step(const TrainCallbacks& cb, bool logged, bool* stop);
};

}  // namespace lockstep::train
