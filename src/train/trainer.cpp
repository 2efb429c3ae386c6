#include "lockstep/train/trainer.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <optional>
#include <thread>

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
#include "lockstep/train/weight_ema.h"
#include "lockstep/train/weights_file.h"
#include "rank_agreement.h"
#include "run_report.h"
#include "train_data.h"

namespace lockstep::train {
namespace fs = std::filesystem;

namespace {
// What travels with the last gradient bucket of every step, summed over the ranks.
struct StepControl {
  double loss = 0;       // each rank's (weighted) loss; summed, divide by the ranks for the mean
  bool stop = false;     // a rank was asked to stop (Ctrl-C, SIGTERM); summed: any rank was
  int64_t replaced = 0;  // images that failed to decode and were replaced; summed

  at::Tensor pack() const {
    return torch::tensor({static_cast<float>(loss), stop ? 1.0f : 0.0f, static_cast<float>(replaced)});
  }
  static StepControl unpack(const at::Tensor& summed) {
    const at::Tensor host = summed.to(at::kCPU, at::kFloat);
    StepControl c;
    c.loss = host[0].item<double>();
    c.stop = host[1].item<float>() > 0;
    c.replaced = std::lround(host[2].item<float>());
    return c;
  }
};

}  // namespace

struct Trainer::State {
  Config config{lockstep_schema()};  // what config.toml and the checkpoint record
  RunSettings run;                   // the same, typed: what the code below reads
  std::string run_dir;
  std::unique_ptr<RunDirLock> run_dir_lock;  // rank 0, which writes the run directory
  std::shared_ptr<dist::Group> group;
  std::unique_ptr<TrainData> data;
  model::Autoencoder model{nullptr};
  std::unique_ptr<Adam> adam;
  model::Autoencoder ema_model{nullptr};    // the weights' moving average, with train.ema_decay > 0
  std::unique_ptr<LrSchedule> lr_schedule;  // the rate of each step, from the step alone
  ReconstructionLossOptions loss_options;   // loss.l2, loss.l1, loss.perceptual
  model::Lpips lpips{nullptr};              // loss.lpips_weights: the perceptual loss's and evaluation's network
  int64_t lpips_hash = 0;                   // of its file, compared across ranks
  std::unique_ptr<Adversary> adversary;     // loss.adversarial > 0
  at::Tensor decoder_last_weight;           // where the adaptive weight compares gradients
  bool bfloat16 = false;                    // train.precision
  model::FidInception fid{nullptr};         // eval.fid_weights, on rank 0 (which evaluates)
  std::vector<at::Tensor> trained_params;
  at::Device device{at::kCPU};  // train.device, resolved for this rank
  int64_t step = 0;
  int64_t batch_size = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t checked_epoch = -1;               // the last epoch whose plan the ranks compared
  int64_t saved_step = -1;                  // the step of the checkpoint on disk, -1 before the first
  std::unique_ptr<quant::Reducer> reducer;  // quantizer statistics over the global batch
  std::unique_ptr<GradientSync> grad_sync;  // distributed runs: gradients averaged during backward
  std::vector<at::Tensor> local_buffers;    // float buffers outside the quantizer (BatchNorm statistics)

  // Buffers that follow each rank's own batch are averaged over ranks here, after the optimizer
  // step: the one defined point where they synchronise (never as a side effect of forward).
  // Quantizer state needs none: it is updated from global statistics.
  void sync_buffers() {
    if (local_buffers.empty()) return;
    torch::NoGradGuard no_grad;
    group->all_reduce(local_buffers, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("train.buffers"));
    for (auto& b : local_buffers) b.div_(group->size());
  }

  bool is_root() const { return group->rank() == 0; }
  bool distributed() const { return group->size() > 1; }

  // Every rank must hold rank 0's parameters and buffers (quantizer codebooks included).
  void check_replicas(const char* when) {
    if (!distributed()) return;  // one replica: nothing to compare, and the checksums cost a pass over the model
    train::check_replicas(*group, replicated_modules(), when);
  }

  // Every rank must train with the same configuration, except keys each may set for itself.
  void check_same_config() {
    Config shared = config;
    for (const auto& key : per_rank_keys()) shared.set(key, lockstep_schema().find(key)->default_value);
    train::check_same_config(*group, shared.to_toml(), lpips_hash);
  }

  // What every rank holds a copy of: the model, and the discriminator when there is one.
  std::vector<const torch::nn::Module*> replicated_modules() const {
    std::vector<const torch::nn::Module*> modules = {model.get()};
    if (adversary) modules.push_back(&adversary->discriminator());
    return modules;
  }

  // Every rank starts from rank 0's parameters and buffers (one checked broadcast).
  void sync_model() {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> tensors;
    for (const torch::nn::Module* m : replicated_modules()) {
      for (const auto& p : m->named_parameters(true)) tensors.push_back(p.value());
      for (const auto& b : m->named_buffers(true)) tensors.push_back(b.value());
    }
    group->broadcast(tensors, 0, LOCKSTEP_CALL_SITE("train.model.init"));
    check_replicas("at start");
  }

  // Everything a run needs from its configuration, for both new and resumed runs.
  void build(bool resuming, const std::function<void(const std::string&)>& on_info) {
    LOCKSTEP_CHECK_ARG(group != nullptr, "trainer: no process group given");
    // One step path for any number of ranks: a group of one makes every collective an identity.
    reducer = std::make_unique<dist::GroupReducer>(group);
    const ThreadChoice threads = choose_threads(run.train.threads(), "train.threads");
    at::set_num_threads(threads.threads);
    if (on_info && is_root()) {
      on_info(detail::concat("intra-op threads: ", threads.threads, " per rank (", threads.reason, ")"));
    }
    torch::manual_seed(static_cast<uint64_t>(run.train.seed()));
    choose_device(on_info);

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
    resolve_dataset(run.data);  // a new run's "auto"; a resumed run's config.toml records the choice
    check_run_settings(run);
    context.batch_size_is_default = config.is_default("train.batch_size");
    data = open_train_data(run, context);
    if (on_info && is_root()) on_info(data->describe());
    // What the data chose (a small folder's global batch) is recorded as the run's setting.
    run.train.batch_size(data->global_batch());
    record_run_settings(run, config);
    batch_size = run.train.batch_size();
    steps_per_epoch = data->steps_per_epoch();
    const int64_t steps = run.train.steps();
    total_steps = steps > 0 ? steps : run.train.epochs() * steps_per_epoch;
    data->set_end_step(total_steps);

    model = build_model(run, config, data->channels());  // on the CPU: the same initial weights on any device
    model->to(device);
    if (run.train.ema_decay() > 0) {
      // Its initial weights are replaced by the model's: built without drawing from torch's generator,
      // so a run with an average trains exactly as one without.
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      const at::Tensor before = generator.get_state();
      ema_model = build_model(run, config, data->channels());
      generator.set_state(before);
      ema_model->to(device);
      ema_model->eval();
    }
    const int64_t f = model->options().downsampling();
    for (const auto& size : data->image_sizes()) {
      LOCKSTEP_CHECK_ARG(size.width % f == 0 && size.height % f == 0, "training images of ", size.width, "x",
                         size.height, " cannot pass through the model's ", model->options().channels().size(),
                         " levels: each side must be a multiple of ", f, " (",
                         run.data.dataset() == "folder" ? "change data.buckets, or " : "",
                         "use fewer model.channels entries)");
    }
    build_losses(data->channels());  // after the model: the discriminator draws from torch's generator next
    if (device.is_cpu()) {           // a step that cannot fit is named now, not by a failed allocation later
      const int64_t micro = batch_size / run.train.grad_accum();
      const int64_t per_rank = (micro + group->size() - 1) / group->size();
      for (const auto& size : data->image_sizes()) {
        int64_t floats = model->activation_floats_per_image(size.height, size.width);
        if (loss_options.perceptual_ > 0)
          floats += model::LpipsImpl::activation_floats_per_pair(size.height, size.width);
        if (adversary) floats += adversary->discriminator().activation_floats_per_image(size.height, size.width);
        check_fits_in_memory(
            4.0 * static_cast<double>(per_rank) * static_cast<double>(floats),
            detail::concat("a training step on ", per_rank, " images of ", size.width, "x", size.height,
                           " per rank (train.batch_size = ", batch_size,
                           ", train.grad_accum = ", run.train.grad_accum(),
                           "; lower the batch, accumulate over more micro-batches, or lower the image size)"));
      }
    }
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (const auto& p : model->named_parameters(true)) params.emplace_back(p.key(), p.value());
    for (const auto& b : model->named_buffers(true)) {
      if (b.key().rfind("quantizer.", 0) != 0 && b.value().is_floating_point()) local_buffers.push_back(b.value());
    }
    trained_params = model->parameters(true);
    grad_sync = std::make_unique<GradientSync>(group, trained_params, run.train.grad_bucket_kb() * 1024);
    adam = std::make_unique<Adam>(std::move(params),
                                  AdamOptions().lr(run.train.lr()).weight_decay(run.train.weight_decay()));
    // A resumed run that extends train.steps stretches the decay over the new total from then on.
    lr_schedule = std::make_unique<LrSchedule>(LrScheduleOptions()
                                                   .lr(run.train.lr())
                                                   .warmup_steps(run.train.warmup_steps())
                                                   .decay(run.train.lr_decay())
                                                   .final_ratio(run.train.lr_final_ratio()),
                                               total_steps);
  }

  // The reconstruction terms, the LPIPS network and the adversary, from the loss.* keys.
  void build_losses(int64_t channels) {
    bfloat16 = run.train.precision() == "bfloat16";
    loss_options.l2(run.loss.l2()).l1(run.loss.l1()).perceptual(run.loss.perceptual());
    const std::string& lpips_path = run.loss.lpips_weights();  // given when perceptual > 0 (check_run_settings)
    // A network only evaluation uses is loaded on rank 0 alone (which evaluates); every rank checks
    // its file is there, so that all stop at the same point.
    if (!lpips_path.empty()) {
      require_weights_file(lpips_path, "loss.lpips_weights", "See docs/losses.md");
      if (loss_options.perceptual_ > 0 || is_root()) {
        lpips = load_lpips(lpips_path, "loss.lpips_weights");
        lpips->to(device);
        lpips->eval();
      }
      // The loss must be the same network on every rank.
      if (loss_options.perceptual_ > 0) lpips_hash = checksum(lpips->buffers());
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
    if (adversarial <= 0) return;
    const bool adaptive = run.loss.adaptive_weight();  // with a reconstruction loss (check_run_settings)
    const double disc_lr = run.loss.disc_lr();
    AdversaryOptions options;
    options.weight = adversarial;
    options.objective = run.loss.gan_loss();
    options.start_step = run.loss.gan_start_step();
    options.adaptive_weight = adaptive;
    options.lecam = run.loss.lecam();
    options.lr = disc_lr > 0 ? disc_lr : run.train.lr();
    options.channels = run.loss.disc_channels();
    options.layers = run.loss.disc_layers();
    options.bucket_bytes = run.train.grad_bucket_kb() * 1024;
    options.bfloat16 = bfloat16;
    adversary = std::make_unique<Adversary>(options, channels, group, device);
    for (const auto& size : data->image_sizes()) adversary->discriminator().check_image_size(size.height, size.width);
    decoder_last_weight = model->output_weight();
  }

  // One optimizer step on this rank's part of the global batch of step `step` + 1. Sets `stop` when
  // any rank was asked to stop during it (every rank sees the same). `logged`: the step's metrics are
  // written, so its gradient norm is wanted even without clipping.
  StepFacts take_step(const TrainCallbacks& cb, bool logged, bool* stop) {
    // Every collective of this step carries it in its fingerprint: one issued elsewhere (a rank
    // running a training-mode forward to validate) cannot pair with this step's.
    const dist::PhaseScope phase(*group, dist::Phase::train_step(step + 1));
    group->set_progress(detail::concat("step ", step + 1, " of ", total_steps));
    check_plan(step / steps_per_epoch);
    const StepBatch batch = data->batch(step);
    const at::Tensor images = batch.images.to(device);
    // Gradient accumulation: micro-batch j is the same images on any number of ranks (the plan
    // gives each rank its part of each), so each forward's statistics are a global micro-batch's.
    const int64_t micro_batches = run.train.grad_accum();
    const std::vector<int64_t> counts =
        data::EpochPlan::rank_micro_counts(batch_size, micro_batches, group->size(), group->rank());
    const bool adversarial = adversary && adversary->active(step + 1);
    StepFacts facts;
    // This rank's loss, stop request and replaced images travel summed with the last gradient
    // bucket, so every rank stops after the same step, whichever rank was asked.
    StepControl here;
    here.stop = cb.stop_requested && cb.stop_requested->load();
    here.replaced = batch.replaced;
    std::vector<at::Tensor> reals, fakes;  // per micro-batch, for the discriminator's step
    std::vector<double> weights;
    double factor_sum = 0;
    int64_t first = 0;
    for (int64_t j = 0; j < micro_batches; ++j) {
      const at::Tensor x = images.narrow(0, first, counts[static_cast<size_t>(j)]);
      first += x.size(0);
      // Quantizer randomness (k-means seeds, dead-code samples) comes from a generator that is a pure
      // function of (seed, step, micro-batch): the same on every rank and after a resume, with no collective.
      quant::QuantizeContext ctx = quant::seeded_context(
          static_cast<uint64_t>(run.train.seed()), static_cast<uint64_t>(step * micro_batches + j),
          data::EpochPlan::rank_offset(batch_size / micro_batches, group->size(), group->rank()));
      ctx.reducer = reducer.get();
      // The loss is weighted so that averaging gradients over ranks (and summing over micro-batches)
      // gives exactly the gradient of the global batch's loss (G4).
      const double weight = static_cast<double>(x.size(0)) * group->size() / static_cast<double>(batch_size);
      at::Tensor reconstruction, nll, loss, g_loss;
      {
        // train.precision = bfloat16: the forward under autocast (the quantizer opts out); backward
        // and everything after it outside.
        std::optional<quant::Autocast> bf16;
        if (bfloat16) bf16.emplace(device.type(), at::kBFloat16);
        const model::AutoencoderOutput out = model->forward(x, ctx);
        reconstruction = out.reconstruction.to(at::kFloat);
        nll = reconstruction_loss(reconstruction, x, loss_options, lpips.is_empty() ? nullptr : lpips.get());
        loss = nll + out.quant.total_loss();
        if (adversarial) g_loss = adversary->generator_loss(reconstruction);
      }
      if (adversarial) {
        // The factor's gradients are not the step's: the sync (begun by an earlier micro-batch) ignores them.
        const GradientSync::Paused paused(*grad_sync);
        const double factor = adversary->factor(nll * weight, g_loss * weight, decoder_last_weight);
        factor_sum += factor;
        loss = loss + g_loss * factor;
        reals.push_back(x);
        fakes.push_back(reconstruction.detach());
        weights.push_back(weight);
      }
      loss = loss * weight;
      here.loss += loss.item<double>();
      if (j == 0) {
        grad_sync->begin_accumulation(micro_batches);
        adam->zero_grad();
      }
      if (j == micro_batches - 1) grad_sync->set_control(here.pack());
      loss.backward();
    }
    const StepControl all = StepControl::unpack(grad_sync->finish());  // gradients now the mean over ranks
    facts.loss = all.loss / group->size();
    facts.replaced = all.replaced;
    facts.waited_s = batch.waited_s;
    facts.image_width = images.size(3);
    facts.image_height = images.size(2);
    // Every rank sees the same summed loss, so every rank stops here together; nothing of this
    // step reaches the parameters or the checkpoint.
    LOCKSTEP_THROW_IF_NOT(std::isfinite(facts.loss), TrainingDiverged, "step ", step + 1, ": the loss is ", facts.loss,
                          ": training diverged (train.lr is ", run.train.lr(), "; a lower one may help). ",
                          saved_step >= 0 ? detail::concat(checkpoint_path(run_dir), " still holds step ", saved_step,
                                                           ", before the divergence")
                                          : std::string("No checkpoint was written yet"));
    // The gradients are the same on every rank now, so are their norm and the clipping.
    const double clip = run.train.grad_clip();
    if (clip > 0) {
      facts.grad_norm = clip_grad_norm(trained_params, clip);
    } else if (logged) {
      facts.grad_norm = global_grad_norm(trained_params);
    }
    facts.lr = lr_schedule->at(step + 1);
    adam->set_lr(facts.lr);
    adam->step();
    sync_buffers();
    if (ema_model) update_weight_ema(*ema_model, *model, run.train.ema_decay());
    if (adversarial) {
      facts.disc_loss = adversary->train_step(reals, fakes, weights);
      facts.adversarial_factor = factor_sum / static_cast<double>(micro_batches);
    }
    facts.adversary = adversary != nullptr;
    ++step;
    *stop = all.stop;
    return facts;
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

  void save() {
    check_replicas(detail::concat("at step ", step).c_str());
    if (!is_root()) return;  // rank 0 holds what every rank holds, as just checked
    Checkpoint c;
    c.model = module_state(*model);
    c.optimizer = adam->state();
    if (ema_model) c.ema = module_state(*ema_model);
    if (adversary) {
      c.discriminator = module_state(adversary->discriminator());
      c.disc_optimizer = adversary->optimizer().state();
      c.disc_optimizer_steps = adversary->optimizer().steps();
    }
    c.torch_rng = at::detail::getDefaultCPUGenerator().get_state();
    c.step = step;
    c.optimizer_steps = adam->steps();
    c.config_toml = config.to_toml();
    save_checkpoint(checkpoint_path(run_dir), c);
    saved_step = step;
  }

  // The trainer runs the model (or its weight average) over the images the data layer holds for evaluation.
  EvalResult evaluate_test(bool weight_average = false) {
    EvalResult r = evaluate(weight_average ? *ema_model : *model, data->evaluation_images(),
                            EvalOptions()
                                .batch_size(run.eval.batch_size())
                                .grid_images(run.eval.grid_images())
                                .lpips(lpips.is_empty() ? nullptr : lpips.ptr())
                                .fid(fid.is_empty() ? nullptr : fid.ptr()));
    r.weight_average = weight_average;
    return r;
  }

  // The average starts as the model, on every rank after the model's broadcast.
  void start_weight_average() {
    if (ema_model) load_module_state(*ema_model, module_state(*model), "the model");
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
  auto s = std::make_unique<State>();
  s->config = config;
  s->run = run_settings(config);
  s->run_dir = run_dir;
  s->group = std::move(group);
  LOCKSTEP_CHECK_ARG(s->group != nullptr, "trainer: no process group given");
  if (s->is_root()) s->run_dir_lock = prepare_new_run_dir(run_dir);
  s->build(/*resuming=*/false, on_info);
  s->check_same_config();
  s->sync_model();
  s->start_weight_average();
  if (s->is_root()) io::write_file_atomic(config_path(run_dir), s->config.to_toml());
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& run_dir, const std::vector<std::string>& overrides,
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
  ResolvedRun resolved = resolve_resumed_run(run_dir, overrides);
  s->config = std::move(resolved.config);
  s->run = std::move(resolved.settings);
  const std::string path = checkpoint_path(run_dir);
  LOCKSTEP_THROW_IF_NOT(fs::exists(path), IoError, "cannot resume ", run_dir, ": it has no checkpoint (", path,
                        "); the run stopped before its first checkpoint, so start it again");
  Checkpoint c = load_checkpoint(path);
  // The checkpoint carries the config it was trained with; keys that shape the model or the
  // data order must still agree with the run directory's config.toml.
  Config saved(lockstep_schema());
  saved.load_toml_string(c.config_toml, path + " (embedded config)");
  // Every run writes every key to config.toml: one the file does not set (it was cut short, or
  // edited) and no override gives would silently take its default, so it must be the checkpoint's.
  std::vector<std::string> lost;
  for (const auto& spec : lockstep_schema().keys()) {
    if (s->config.is_default(spec.key) && !saved.is_default(spec.key) &&
        saved.get(spec.key) != s->config.get(spec.key)) {
      lost.push_back(spec.key + " = " + format_value(saved.get(spec.key)));
    }
  }
  const size_t lost_count = lost.size();
  if (lost.size() > 6) lost.resize(6);
  LOCKSTEP_THROW_IF_NOT(lost_count == 0, CorruptInput, "cannot resume ", run_dir, ": ", config_path(run_dir),
                        " does not set ", lost_count, " key(s) that the checkpoint's configuration sets (",
                        detail::concat_list(lost), lost_count > lost.size() ? ", ..." : "",
                        "); the file was cut short or edited: restore it");
  for (const auto& spec : lockstep_schema().keys()) {
    LOCKSTEP_THROW_IF_NOT(spec.resumable || saved.get(spec.key) == s->config.get(spec.key), CorruptInput,
                          "cannot resume ", run_dir, ": '", spec.key, "' is ", format_value(s->config.get(spec.key)),
                          " in ", config_path(run_dir), " but ", format_value(saved.get(spec.key)),
                          " in the checkpoint");
  }
  s->build(/*resuming=*/true, on_info);
  load_module_state(*s->model, c.model, path);
  LOCKSTEP_THROW_IF_NOT(c.ema.empty() == !s->ema_model, CorruptInput, path, ": ",
                        c.ema.empty() ? "holds no weight average" : "holds a weight average",
                        ", but its run has train.ema_decay = ", s->run.train.ema_decay());
  if (s->ema_model) load_module_state(*s->ema_model, c.ema, path + " (weight average)");
  LOCKSTEP_THROW_IF_NOT(c.discriminator.empty() == !s->adversary, CorruptInput, path, ": ",
                        c.discriminator.empty() ? "holds no discriminator" : "holds a discriminator",
                        ", but its run has loss.adversarial = ", s->run.loss.adversarial());
  if (s->adversary) {
    load_module_state(s->adversary->discriminator(), c.discriminator, path + " (discriminator)");
    s->adversary->optimizer().load_state(c.disc_optimizer, c.disc_optimizer_steps);
  }
  s->adam->load_state(c.optimizer, c.optimizer_steps);
  LOCKSTEP_THROW_IF_NOT(c.torch_rng.defined(), CorruptInput, path, ": checkpoint has no RNG state");
  at::Generator cpu_generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor expected_rng = cpu_generator.get_state();
  LOCKSTEP_THROW_IF_NOT(
      c.torch_rng.scalar_type() == expected_rng.scalar_type() && c.torch_rng.sizes() == expected_rng.sizes(),
      CorruptInput, path, ": its RNG state is ", c.torch_rng.scalar_type(), " ", c.torch_rng.sizes(),
      ", a CPU generator's state is ", expected_rng.scalar_type(), " ", expected_rng.sizes());
  try {
    cpu_generator.set_state(c.torch_rng);
  } catch (const c10::Error& e) {
    throw CorruptInput(
        detail::concat(path, ": its RNG state is not a valid generator state: ", e.what_without_backtrace()));
  }
  s->step = c.step;
  s->saved_step = c.step;
  s->check_same_config();
  s->sync_model();  // every rank read the same file; the broadcast also checks that all arrived
  if (!overrides.empty() && s->is_root()) io::write_file_atomic(config_path(run_dir), s->config.to_toml());
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

TrainSummary Trainer::run(const TrainCallbacks& cb) {
  State& s = *s_;
  RunShape shape;
  shape.total_steps = s.total_steps;
  shape.steps_per_epoch = s.steps_per_epoch;
  shape.batch_size = s.batch_size;
  shape.log_every = s.run.train.log_every();
  RunReport report(s.is_root() ? metrics_path(s.run_dir) : std::string(), s.step, shape, cb, s.is_root());
  const int64_t checkpoint_every = s.run.train.checkpoint_every();
  const int64_t eval_every = s.run.train.eval_every();
  if (s.step > 0 && cb.on_info) cb.on_info(detail::concat("resumed at step ", s.step, " of ", s.total_steps));

  TrainSummary summary;
  summary.run_dir = s.run_dir;
  s.model->train();
  while (s.step < s.total_steps) {
    bool stop = false;
    const StepFacts facts = s.take_step(cb, report.logs(s.step + 1), &stop);
    report.after_step(s.step, facts, s.data->unreadable());
    if (stop) summary.interrupted = true;
    if (checkpoint_every > 0 && s.step % checkpoint_every == 0 && s.step < s.total_steps) {
      s.save();
      if (cb.on_info) cb.on_info(detail::concat("checkpoint at step ", s.step));
    }
    // Rank 0 alone evaluates (its forwards in evaluation mode issue no collective, G3).
    if (s.is_root() && eval_every > 0 && s.step % eval_every == 0 && s.step < s.total_steps) {
      report.after_eval(s.step, s.evaluate_test());
      if (s.ema_model) report.after_eval(s.step, s.evaluate_test(/*weight_average=*/true));
    }
    if (summary.interrupted) break;
  }

  s.save();
  summary.steps = s.step;
  if (s.is_root()) {
    if (!summary.interrupted) {
      summary.test = s.evaluate_test();
      report.after_eval(s.step, summary.test);
      if (!summary.test.grid.pixels.empty()) io::save_png(reconstructions_path(s.run_dir), summary.test.grid);
      if (s.ema_model) {
        summary.test_weight_average = s.evaluate_test(/*weight_average=*/true);
        report.after_eval(s.step, summary.test_weight_average);
      }
    }
    summary.seconds = report.elapsed_s();
    write_summary(s.run_dir, summary.steps, summary.interrupted, summary.seconds, summary.test,
                  s.ema_model ? &summary.test_weight_average : nullptr);
  }
  // Every rank ends together: a rank 0 that failed while saving or evaluating fails them all.
  s.group->barrier(LOCKSTEP_CALL_SITE("train.end"));
  summary.seconds = report.elapsed_s();
  return summary;
}

}  // namespace lockstep::train
