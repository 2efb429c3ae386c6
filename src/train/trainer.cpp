#include "lockstep/train/trainer.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <thread>

#include "checkpointing.h"
#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/core/memory.h"
#include "lockstep/core/threads.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/group_reducer.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/quant/autocast.h"
#include "lockstep/quant/call_context.h"
#include "lockstep/train/adam.h"
#include "lockstep/train/adversary.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/device.h"
#include "lockstep/train/fid.h"
#include "lockstep/train/grad_clip.h"
#include "lockstep/train/grad_sync.h"
#include "lockstep/train/losses.h"
#include "lockstep/train/lpips_weights.h"
#include "lockstep/train/lr_schedule.h"
#include "lockstep/train/metrics.h"
#include "lockstep/train/model_factory.h"
#include "lockstep/train/resolve_run.h"
#include "lockstep/train/run_dir.h"
#include "lockstep/train/run_settings.h"
#include "lockstep/train/step_geometry.h"
#include "lockstep/train/weight_ema.h"
#include "lockstep/train/weights_file.h"
#include "rank_agreement.h"
#include "run_report.h"
#include "step_runner.h"
#include "train_data.h"
#include "trainer_state.h"

namespace lockstep::train {
namespace fs = std::filesystem;

void Trainer::State::check_replicas(const char* when) {
  if (!distributed()) return;  // one replica: nothing to compare, and the checksums cost a pass over the model
  train::check_replicas(*group, modules.replicated(), when);
}

void Trainer::State::check_same_config() {
  Config shared = config;
  for (const auto& key : per_rank_keys()) shared.set(key, lockstep_schema().find(key)->default_value);
  train::check_same_config(*group, shared.to_toml(), lpips_hash);
}

void Trainer::State::sync_model() {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  for (const torch::nn::Module* m : modules.replicated()) {
    for (const auto& p : m->named_parameters(true)) tensors.push_back(p.value());
    for (const auto& b : m->named_buffers(true)) tensors.push_back(b.value());
  }
  group->broadcast(tensors, 0, LOCKSTEP_CALL_SITE("train.model.init"));
  check_replicas("at start");
}

void Trainer::State::check_plan(int64_t epoch) {
  if (epoch == checked_epoch) return;
  checked_epoch = epoch;
  const data::EpochPlan plan = data->plan(epoch);
  check_same_plan(*group, epoch,
                  {static_cast<int64_t>(plan.hash()), plan.steps(), static_cast<int64_t>(data->data_hash()),
                   data->training_images()});
}

bool Trainer::State::any_rank_stopping(const std::atomic<bool>* stop_requested) {
  at::Tensor flag =
      torch::full({1}, stop_requested && stop_requested->load() ? 1.0f : 0.0f, torch::TensorOptions(plan.device));
  if (group->size() == 1) return flag.item<float>() > 0;
  std::vector<at::Tensor> tensors{flag};
  group->all_reduce(tensors, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("train.stop_after_pause"));
  return tensors[0].item<float>() > 0;
}

void Trainer::State::save() {
  check_replicas(detail::concat("at step ", step).c_str());
  saved_step = step;       // on every rank, which all decide alike whether a save is due
  if (!is_root()) return;  // rank 0 holds what every rank holds, as just checked
  save_checkpoint(checkpoint_path(run_dir), capture_checkpoint(modules, step, config));
}

EvalResult Trainer::State::evaluate_test(bool weight_average, const std::atomic<bool>* stop) {
  EvalResult r = evaluate(weight_average ? *modules.ema_model : *modules.model, data->evaluation_images(),
                          EvalOptions()
                              .batch_size(run.eval.batch_size())
                              .grid_images(run.eval.grid_images())
                              .lpips(lpips.is_empty() ? nullptr : lpips.ptr())
                              .fid(fid.is_empty() ? nullptr : fid.ptr())
                              .stop_requested(stop));
  r.weight_average = weight_average;
  return r;
}

void Trainer::State::start_weight_average() {
  if (modules.ema_model) load_module_state(*modules.ema_model, module_state(*modules.model), "the model");
}

StepFacts Trainer::State::take_step(const TrainCallbacks& cb, bool logged, bool* stop) {
  // Every collective of this step carries it in its fingerprint: one issued elsewhere (a rank
  // running a training-mode forward to validate) cannot pair with this step's.
  const dist::PhaseScope phase(*group, dist::Phase::train_step(step + 1));
  group->set_progress(detail::concat("step ", step + 1, " of ", plan.total_steps));
  check_plan(plan.epoch_of(step));
  const StepBatch batch = data->batch(step);
  const StepFacts facts = runner->take(step, batch, plan.device, cb.stop_requested, logged, stop, [this] {
    return saved_step >= 0
               ? detail::concat(checkpoint_path(run_dir), " still holds step ", saved_step, ", before the divergence")
               : std::string("No checkpoint was written yet");
  });
  ++step;
  return facts;
}

Trainer::Trainer(std::unique_ptr<State> state) : s_(std::move(state)) {}
Trainer::~Trainer() = default;
const Config& Trainer::config() const { return s_->config; }
const RunSettings& Trainer::settings() const { return s_->run; }
int64_t Trainer::step() const { return s_->step; }
const std::vector<std::string>& Trainer::resumable_keys() {
  static const std::vector<std::string> keys = train::resumable_keys();
  return keys;
}

std::unique_ptr<Trainer> Trainer::create(const Config& config, const std::string& run_dir,
                                         std::shared_ptr<dist::Group> group, const InfoCallback& on_info) {
  return create(resolve_config(config), run_dir, std::move(group), on_info);
}

std::unique_ptr<Trainer> Trainer::create(ResolvedRun run, const std::string& run_dir,
                                         std::shared_ptr<dist::Group> group, const InfoCallback& on_info) {
  auto s = std::make_unique<State>();
  s->config = std::move(run.config);
  s->run = std::move(run.settings);  // checked across keys when the data opens (build)
  s->run_dir = run_dir;
  s->group = std::move(group);
  LOCKSTEP_CHECK_ARG(s->group != nullptr, "trainer: no process group given");
  if (s->is_root()) s->run_dir_lock = prepare_new_run_dir(run_dir);
  return start_from_scratch(std::move(s), on_info);
}

std::unique_ptr<Trainer> Trainer::start_from_scratch(std::unique_ptr<State> s, const InfoCallback& on_info) {
  s->build(/*resuming=*/false, on_info);
  s->check_same_config();
  s->sync_model();
  s->start_weight_average();
  if (s->is_root()) io::write_file_atomic(config_path(s->run_dir), s->config.to_toml());
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& run_dir, const std::vector<std::string>& overrides,
                                         std::shared_ptr<dist::Group> group, const InfoCallback& on_info) {
  LOCKSTEP_CHECK_ARG(group != nullptr, "trainer: no process group given");
  return resume(run_dir, resolve_resumed_run(run_dir, overrides), !overrides.empty(), std::move(group), on_info);
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& run_dir, ResolvedRun run, bool overridden,
                                         std::shared_ptr<dist::Group> group, const InfoCallback& on_info) {
  auto s = std::make_unique<State>();
  s->run_dir = run_dir;
  s->group = std::move(group);
  LOCKSTEP_CHECK_ARG(s->group != nullptr, "trainer: no process group given");
  LOCKSTEP_THROW_IF_NOT(fs::is_directory(run_dir), IoError, "cannot resume: ", run_dir, " is not a directory");
  if (s->is_root()) {
    s->run_dir_lock = std::make_unique<RunDirLock>(run_dir);
    const auto removed = remove_stale_temporaries(run_dir);
    if (!removed.empty() && on_info) {
      on_info(detail::concat("removed ", removed.size(), " temporary file(s) a stopped process left in ", run_dir, ": ",
                             detail::concat_list(removed)));
    }
  }
  s->config = std::move(run.config);
  s->run = std::move(run.settings);
  const std::string path = checkpoint_path(run_dir);
  if (!fs::exists(path)) {
    // A run whose records say it got past its first checkpoint has lost that checkpoint: starting
    // again would write over its records, so nothing is touched.
    const int64_t every = s->run.train.checkpoint_every();
    const auto records =
        records_past_first_checkpoint(run_dir, every > 0 ? every : std::numeric_limits<int64_t>::max());
    LOCKSTEP_THROW_IF_NOT(records.empty(), IoError, "cannot resume ", run_dir, ": ", checkpoint_path(run_dir),
                          " is missing, but the run got past its first checkpoint: ", detail::concat_list(records),
                          ". Nothing was changed; put the checkpoint back, or train a new run with --run-dir");
    // Stopped before its first checkpoint (checkpoint_every defaults to 500): nothing to continue,
    // and `lockstep train --run-dir` refuses a directory that holds a run, so it starts again here.
    if (on_info) {
      on_info(detail::concat(run_dir,
                             " has no checkpoint: the run stopped before its first one, so it starts "
                             "again from step 0 with its config.toml",
                             overridden ? " and the settings given" : ""));
    }
    return start_from_scratch(std::move(s), on_info);
  }
  Checkpoint c = load_checkpoint(path);
  // The checkpoint carries the config it was trained with; keys that shape the model or the
  // data order must still agree with the run directory's config.toml.
  Config saved(lockstep_schema());
  saved.load_toml_string(c.config_toml, path + " (embedded config)");
  check_resumed_config(s->config, saved, run_dir, path);
  s->build(/*resuming=*/true, on_info);
  restore_checkpoint(s->modules, c, path, s->run);
  s->step = c.step;
  s->saved_step = c.step;
  s->check_same_config();
  s->sync_model();  // every rank read the same file; the broadcast also checks that all arrived
  if (overridden && s->is_root()) io::write_file_atomic(config_path(run_dir), s->config.to_toml());
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

TrainSummary Trainer::run(const TrainCallbacks& cb) {
  State& s = *s_;
  RunReport report(s.is_root() ? metrics_path(s.run_dir) : std::string(), s.step, s.plan, s.run.train.log_every(), cb,
                   s.is_root());
  const int64_t checkpoint_every = s.run.train.checkpoint_every();
  const int64_t eval_every = s.run.train.eval_every();
  if (s.step > 0 && cb.on_info) cb.on_info(detail::concat("resumed at step ", s.step, " of ", s.plan.total_steps));

  TrainSummary summary;
  summary.run_dir = s.run_dir;
  s.modules.model->train();
  while (s.step < s.plan.total_steps) {
    bool stop = false;
    const StepFacts facts = s.take_step(cb, report.logs(s.step + 1), &stop);
    report.after_step(s.step, facts, s.data->unreadable());
    // A stop agreed at the last step is no interruption: the run is complete (only its final
    // evaluation is skipped, below).
    if (stop && s.step < s.plan.total_steps) summary.interrupted = true;
    if (stop) summary.evaluation_skipped = true;
    const bool checkpoint_due = checkpoint_every > 0 && s.step % checkpoint_every == 0 && s.step < s.plan.total_steps;
    if (checkpoint_due) {
      s.save();
      if (cb.on_info) cb.on_info(detail::concat("checkpoint at step ", s.step));
    }
    // Rank 0 alone evaluates (its forwards in evaluation mode issue no collective, G3). Ctrl-C
    // during it skips the rest of it.
    const bool eval_due = eval_every > 0 && s.step % eval_every == 0 && s.step < s.plan.total_steps && !stop;
    if (s.is_root() && eval_due) {
      try {
        report.after_eval(s.step, s.evaluate_test(false, cb.stop_requested));
        if (s.modules.ema_model) report.after_eval(s.step, s.evaluate_test(true, cb.stop_requested));
      } catch (const EvaluationStopped& e) {
        if (cb.on_info) cb.on_info(detail::concat("step ", s.step, ": ", e.what()));
      }
    }
    // A stop asked for during a checkpoint write or an evaluation ends the run here, not one step later.
    if (!stop && (checkpoint_due || eval_due) && s.any_rank_stopping(cb.stop_requested)) {
      stop = true;
      summary.interrupted = summary.evaluation_skipped = true;
    }
    if (stop) break;
  }

  if (s.saved_step != s.step) s.save();  // once: the loop may have just saved this step
  summary.steps = s.step;
  if (s.is_root()) {
    if (!summary.evaluation_skipped) {
      try {
        summary.test = s.evaluate_test(false, cb.stop_requested);
        if (s.modules.ema_model) summary.test_weight_average = s.evaluate_test(true, cb.stop_requested);
      } catch (const EvaluationStopped& e) {
        // Ctrl-C during the final evaluation: stopped promptly; the checkpoint above is intact.
        summary.evaluation_skipped = true;
        summary.test = {};
        summary.test_weight_average = {};
        if (cb.on_info) cb.on_info(detail::concat("final ", e.what()));
      }
    }
    if (!summary.evaluation_skipped) {
      report.after_eval(s.step, summary.test);
      if (!summary.test.grid.pixels.empty()) io::save_png(reconstructions_path(s.run_dir), summary.test.grid);
      if (s.modules.ema_model) report.after_eval(s.step, summary.test_weight_average);
    }
    summary.seconds = report.elapsed_s();
    write_summary(s.run_dir, summary.steps, summary.interrupted, !summary.evaluation_skipped, summary.seconds,
                  summary.test, s.modules.ema_model ? &summary.test_weight_average : nullptr);
  }
  // Every rank ends together: a rank 0 that failed while saving or evaluating fails them all.
  s.group->barrier(LOCKSTEP_CALL_SITE("train.end"));
  summary.seconds = report.elapsed_s();
  return summary;
}

}  // namespace lockstep::train
