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

namespace lockstep::train {
namespace fs = std::filesystem;

struct Trainer::State {
  // As configured (ResolvedRun::config); once the data is open, what config.toml and the checkpoint record
  // (recorded_config).
  Config config{lockstep_schema()};
  RunSettings run;  // the resolved settings, typed: what the code below reads (never changed)
  std::string run_dir;
  std::unique_ptr<RunDirLock> run_dir_lock;  // rank 0, which writes the run directory
  std::shared_ptr<dist::Group> group;
  std::unique_ptr<TrainData> data;
  TrainedModules modules;              // what the run trains and its checkpoint holds
  std::unique_ptr<StepRunner> runner;  // takes each optimizer step
  model::Lpips lpips{nullptr};         // loss.lpips_weights: the perceptual loss's and evaluation's network
  int64_t lpips_hash = 0;              // of its file, compared across ranks
  model::FidInception fid{nullptr};    // eval.fid_weights, on rank 0 (which evaluates)
  at::Device device{at::kCPU};         // train.device, resolved for this rank
  int64_t step = 0;
  StepGeometry geometry;  // the step's shape, its global batch the data's (a small folder's fitted batch)
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t checked_epoch = -1;  // the last epoch whose plan the ranks compared
  int64_t saved_step = -1;     // the step of the checkpoint on disk, -1 before the first

  bool is_root() const { return group->rank() == 0; }
  bool distributed() const { return group->size() > 1; }

  // Every rank must hold rank 0's parameters and buffers (quantizer codebooks included).
  void check_replicas(const char* when) {
    if (!distributed()) return;  // one replica: nothing to compare, and the checksums cost a pass over the model
    train::check_replicas(*group, modules.replicated(), when);
  }

  // Every rank must train with the same configuration, except keys each may set for itself.
  void check_same_config() {
    Config shared = config;
    for (const auto& key : per_rank_keys()) shared.set(key, lockstep_schema().find(key)->default_value);
    train::check_same_config(*group, shared.to_toml(), lpips_hash);
  }

  // Every rank starts from rank 0's parameters and buffers (one checked broadcast).
  void sync_model() {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> tensors;
    for (const torch::nn::Module* m : modules.replicated()) {
      for (const auto& p : m->named_parameters(true)) tensors.push_back(p.value());
      for (const auto& b : m->named_buffers(true)) tensors.push_back(b.value());
    }
    group->broadcast(tensors, 0, LOCKSTEP_CALL_SITE("train.model.init"));
    check_replicas("at start");
  }

  // Everything a run needs from its configuration, for both new and resumed runs.
  void build(bool resuming, const std::function<void(const std::string&)>& on_info) {
    LOCKSTEP_CHECK_ARG(group != nullptr, "trainer: no process group given");
    const ThreadChoice threads = choose_threads(run.train.threads(), "train.threads");
    at::set_num_threads(threads.threads);
    if (on_info && is_root()) {
      on_info(detail::concat("intra-op threads: ", threads.threads, " per rank (", threads.reason, ")"));
    }
    torch::manual_seed(static_cast<uint64_t>(run.train.seed()));
    choose_device(on_info);
    open_data(resuming, on_info);
    build_model_and_average();
    StepLosses losses = build_losses(data->channels());  // after the model: the discriminator draws next
    check_step_fits(losses);
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (const auto& p : modules.model->named_parameters(true)) params.emplace_back(p.key(), p.value());
    modules.adam = std::make_unique<Adam>(std::move(params),
                                          AdamOptions().lr(run.train.lr()).weight_decay(run.train.weight_decay()));
    runner = std::make_unique<StepRunner>(group, run, geometry, total_steps, modules, std::move(losses));
  }

  // The training data; what it decided (a small folder's global batch) shapes the step and is recorded
  // in the run's configuration; the settings stay as resolved.
  void open_data(bool resuming, const std::function<void(const std::string&)>& on_info) {
    DataContext context;
    context.run_dir = run_dir;
    context.resuming = resuming;
    context.rank = group->rank();
    context.world_size = group->size();
    // Progress before the first collective (a long scan) also goes where the others' reports look.
    context.on_info = [this, on_info](const std::string& text) {
      group->set_progress(text);
      if (on_info) on_info(text);
    };
    group->set_progress("opening the data");
    check_run_settings(run);
    context.batch_size_is_default = config.is_default("train.batch_size");
    data = open_train_data(run, context);
    if (on_info && is_root()) on_info(data->describe());
    geometry = StepGeometry::of(run.train, data->global_batch());
    config = recorded_config(ResolvedRun{config, run}, data->global_batch());
    steps_per_epoch = data->steps_per_epoch();
    const int64_t steps = run.train.steps();
    total_steps = steps > 0 ? steps : run.train.epochs() * steps_per_epoch;
    data->set_end_step(total_steps);
  }

  // The model (on the CPU first: the same initial weights on any device) and its weight average.
  void build_model_and_average() {
    auto& model = modules.model;
    model = build_model(run, config, data->channels());
    model->to(device);
    if (run.train.ema_decay() > 0) {
      // Its initial weights are replaced by the model's: built without drawing from torch's generator,
      // so a run with an average trains exactly as one without.
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      const at::Tensor before = generator.get_state();
      modules.ema_model = build_model(run, config, data->channels());
      generator.set_state(before);
      modules.ema_model->to(device);
      modules.ema_model->eval();
    }
    const int64_t f = model->options().downsampling();
    for (const auto& size : data->image_sizes()) {
      LOCKSTEP_CHECK_ARG(size.width % f == 0 && size.height % f == 0, "training images of ", size.width, "x",
                         size.height, " cannot pass through the model's ", model->options().channels().size(),
                         " levels: each side must be a multiple of ", f, " (",
                         run.data.dataset() == "folder" ? "change data.buckets, or " : "",
                         "use fewer model.channels entries)");
    }
  }

  // On the CPU, a step that cannot fit in memory is named now, not by a failed allocation later.
  void check_step_fits(const StepLosses& losses) const {
    if (device.is_cpu()) {
      // In shards, a pass holds one shard's activations, and each of the rank's shards keeps its
      // gradients until the step's exact sum.
      const int64_t per_pass = geometry.sharded() ? geometry.shard_size : geometry.most_per_rank(group->size());
      double kept = 0;
      if (geometry.sharded()) {
        const int64_t shards = geometry.shards_per_rank(group->size());
        int64_t params = 0;
        for (const auto& p : modules.model->parameters(true)) params += p.numel();
        kept = 4.0 * static_cast<double>(shards) * static_cast<double>(params + 1);
      }
      for (const auto& size : data->image_sizes()) {
        int64_t floats = modules.model->activation_floats_per_image(size.height, size.width);
        if (losses.reconstruction.perceptual_ > 0)
          floats += model::LpipsImpl::activation_floats_per_pair(size.height, size.width);
        if (modules.adversary)
          floats += modules.adversary->discriminator().activation_floats_per_image(size.height, size.width);
        check_fits_in_memory(
            4.0 * static_cast<double>(per_pass) * static_cast<double>(floats) + kept,
            detail::concat(
                "a training step on ", per_pass, " images of ", size.width, "x", size.height,
                geometry.sharded() ? " per pass" : " per rank", " (train.batch_size = ", geometry.global_batch,
                ", train.grad_accum = ", geometry.micro_batches,
                geometry.sharded()
                    ? detail::concat(", train.shard_size = ", geometry.shard_size, ", whose gradients each rank keeps")
                    : std::string(),
                "; lower the batch, accumulate over more micro-batches, or lower the image size)"));
      }
    }
  }

  // The reconstruction terms, the LPIPS network and the adversary, from the loss.* keys.
  StepLosses build_losses(int64_t channels) {
    StepLosses losses;
    losses.bfloat16 = run.train.precision() == "bfloat16";
    const double perceptual = run.loss.perceptual();
    losses.reconstruction.l2(run.loss.l2()).l1(run.loss.l1()).perceptual(perceptual);
    const std::string& lpips_path = run.loss.lpips_weights();  // given when perceptual > 0 (check_run_settings)
    // A network only evaluation uses is loaded on rank 0 alone (which evaluates); every rank checks
    // its file is there, so that all stop at the same point.
    if (!lpips_path.empty()) {
      require_weights_file(lpips_path, "loss.lpips_weights", "See docs/losses.md");
      if (perceptual > 0 || is_root()) {
        lpips = load_lpips(lpips_path, "loss.lpips_weights");
        lpips->to(device);
        lpips->eval();
      }
      // The loss must be the same network on every rank.
      if (perceptual > 0) {
        lpips_hash = checksum(lpips->buffers());
        losses.lpips = lpips;
      }
    }
    const std::string& fid_path = run.eval.fid_weights();
    if (!fid_path.empty()) {
      require_weights_file(fid_path, "eval.fid_weights", "See docs/losses.md");
      if (is_root()) {
        fid = load_fid_inception(fid_path, "eval.fid_weights");
        fid->to(device);
      }
    }
    const double adversarial = run.loss.adversarial();
    if (adversarial <= 0) return losses;
    const double disc_lr = run.loss.disc_lr();
    AdversaryOptions options;
    options.weight = adversarial;
    options.objective = run.loss.gan_loss();
    options.start_step = run.loss.gan_start_step();
    options.adaptive_weight = run.loss.adaptive_weight();  // with a reconstruction loss (check_run_settings)
    options.lecam = run.loss.lecam();
    options.lr = disc_lr > 0 ? disc_lr : run.train.lr();
    options.channels = run.loss.disc_channels();
    options.layers = run.loss.disc_layers();
    options.bucket_bytes = run.train.grad_bucket_kb() * 1024;
    options.bfloat16 = losses.bfloat16;
    modules.adversary = std::make_unique<Adversary>(options, channels, group, device);
    for (const auto& size : data->image_sizes()) {
      modules.adversary->discriminator().check_image_size(size.height, size.width);
    }
    return losses;
  }

  // train.device for this rank; a distributed run's group must carry tensors there (NCCL on CUDA).
  void choose_device(const std::function<void(const std::string&)>& on_info) {
    const std::string spec = run.train.device();
    const int index = cuda_index_for(parse_device_spec(spec));
    device = index < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
    LOCKSTEP_CHECK_ARG(group->carries(device), "rank ", group->rank(), " of ", group->size(), ": train.device = ", spec,
                       " puts this rank on ", device, ", but its process group (", group->describe(),
                       ") carries no tensors there; a distributed run on CUDA needs a group made with "
                       "GroupOptions::cuda_device = ",
                       index, " (lockstep train does this)");
    if (on_info && is_root() && index >= 0) {
      on_info(distributed() ? detail::concat("rank 0 trains on ", device, " (each rank on its train.device)")
                            : detail::concat("training on ", device));
    }
  }

  // G5: at the start of each epoch the ranks compare (plan hash, steps, data hash) and stop at once
  // if their data differ (another data.dir with other images, say), instead of training on
  // different data or running different numbers of steps.
  void check_plan(int64_t epoch) {
    if (epoch == checked_epoch) return;
    checked_epoch = epoch;
    const data::EpochPlan plan = data->plan(epoch);
    check_same_plan(*group, epoch,
                    {static_cast<int64_t>(plan.hash()), plan.steps(), static_cast<int64_t>(data->data_hash()),
                     data->training_images()});
  }

  // Whether any rank was asked to stop: one small collective, taken only between steps after a
  // checkpoint or an evaluation (the steps carry the request themselves, with their last bucket).
  bool any_rank_stopping(const std::atomic<bool>* stop_requested) {
    at::Tensor flag =
        torch::full({1}, stop_requested && stop_requested->load() ? 1.0f : 0.0f, torch::TensorOptions(device));
    if (group->size() == 1) return flag.item<float>() > 0;
    std::vector<at::Tensor> tensors{flag};
    group->all_reduce(tensors, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("train.stop_after_pause"));
    return tensors[0].item<float>() > 0;
  }

  void save() {
    check_replicas(detail::concat("at step ", step).c_str());
    saved_step = step;       // on every rank, which all decide alike whether a save is due
    if (!is_root()) return;  // rank 0 holds what every rank holds, as just checked
    save_checkpoint(checkpoint_path(run_dir), capture_checkpoint(modules, step, config));
  }

  // The trainer runs the model (or its weight average) over the images the data layer holds for
  // evaluation; EvaluationStopped once `stop` is set (Ctrl-C), when given.
  EvalResult evaluate_test(bool weight_average = false, const std::atomic<bool>* stop = nullptr) {
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

  // The average starts as the model, on every rank after the model's broadcast.
  void start_weight_average() {
    if (modules.ema_model) load_module_state(*modules.ema_model, module_state(*modules.model), "the model");
  }

  // Step `step` + 1 on this rank's part of its global batch; sets `stop` as StepRunner::take does.
  StepFacts take_step(const TrainCallbacks& cb, bool logged, bool* stop) {
    // Every collective of this step carries it in its fingerprint: one issued elsewhere (a rank
    // running a training-mode forward to validate) cannot pair with this step's.
    const dist::PhaseScope phase(*group, dist::Phase::train_step(step + 1));
    group->set_progress(detail::concat("step ", step + 1, " of ", total_steps));
    check_plan(step / steps_per_epoch);
    const StepBatch batch = data->batch(step);
    const StepFacts facts = runner->take(step, batch, device, cb.stop_requested, logged, stop, [this] {
      return saved_step >= 0
                 ? detail::concat(checkpoint_path(run_dir), " still holds step ", saved_step, ", before the divergence")
                 : std::string("No checkpoint was written yet");
    });
    ++step;
    return facts;
  }
};

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
  RunShape shape;
  shape.total_steps = s.total_steps;
  shape.steps_per_epoch = s.steps_per_epoch;
  shape.batch_size = s.geometry.global_batch;
  shape.log_every = s.run.train.log_every();
  RunReport report(s.is_root() ? metrics_path(s.run_dir) : std::string(), s.step, shape, cb, s.is_root());
  const int64_t checkpoint_every = s.run.train.checkpoint_every();
  const int64_t eval_every = s.run.train.eval_every();
  if (s.step > 0 && cb.on_info) cb.on_info(detail::concat("resumed at step ", s.step, " of ", s.total_steps));

  TrainSummary summary;
  summary.run_dir = s.run_dir;
  s.modules.model->train();
  while (s.step < s.total_steps) {
    bool stop = false;
    const StepFacts facts = s.take_step(cb, report.logs(s.step + 1), &stop);
    report.after_step(s.step, facts, s.data->unreadable());
    // A stop agreed at the last step is no interruption: the run is complete (only its final
    // evaluation is skipped, below).
    if (stop && s.step < s.total_steps) summary.interrupted = true;
    if (stop) summary.evaluation_skipped = true;
    const bool checkpoint_due = checkpoint_every > 0 && s.step % checkpoint_every == 0 && s.step < s.total_steps;
    if (checkpoint_due) {
      s.save();
      if (cb.on_info) cb.on_info(detail::concat("checkpoint at step ", s.step));
    }
    // Rank 0 alone evaluates (its forwards in evaluation mode issue no collective, G3). Ctrl-C
    // during it skips the rest of it.
    const bool eval_due = eval_every > 0 && s.step % eval_every == 0 && s.step < s.total_steps && !stop;
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
