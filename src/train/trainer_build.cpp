// How a run is built from its settings: threads and seed, its device, its data and the step's shape,
// the model and its weight average, the losses (LPIPS, FID, the adversary), the optimizer and the step
// runner; and the checks that refuse what cannot run (image sizes, memory) before the first step.
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/core/memory.h"
#include "lockstep/core/threads.h"
#include "lockstep/train/adam.h"
#include "lockstep/train/adversary.h"
#include "lockstep/train/device.h"
#include "lockstep/train/fid.h"
#include "lockstep/train/lpips_weights.h"
#include "lockstep/train/model_factory.h"
#include "lockstep/train/resolve_run.h"
#include "lockstep/train/weights_file.h"
#include "rank_agreement.h"
#include "trainer_state.h"

namespace lockstep::train {

void Trainer::State::build(bool resuming, const std::function<void(const std::string&)>& on_info) {
  LOCKSTEP_CHECK_ARG(group != nullptr, "trainer: no process group given");
  const ThreadChoice threads = choose_threads(run.train.threads(), "train.threads");
  at::set_num_threads(threads.threads);
  if (on_info && is_root()) {
    on_info(detail::concat("intra-op threads: ", threads.threads, " per rank (", threads.reason, ")"));
  }
  torch::manual_seed(static_cast<uint64_t>(run.train.seed()));
  open_data(resuming, choose_device(on_info), on_info);
  build_model_and_average();
  StepLosses losses = build_losses(data->channels());  // after the model: the discriminator draws next
  check_step_fits(losses);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : modules.model->named_parameters(true)) params.emplace_back(p.key(), p.value());
  modules.adam = std::make_unique<Adam>(std::move(params),
                                        AdamOptions().lr(run.train.lr()).weight_decay(run.train.weight_decay()));
  runner = std::make_unique<StepRunner>(group, run, plan.geometry, plan.total_steps, modules, std::move(losses));
}

RunPlan RunPlan::of(const RunSettings& run, const TrainData& data, at::Device device) {
  RunPlan plan;
  plan.device = device;
  plan.geometry = StepGeometry::of(run.train);
  plan.steps_per_epoch = data.steps_per_epoch();
  plan.total_steps = run.train.steps() > 0 ? run.train.steps() : run.train.epochs() * plan.steps_per_epoch;
  return plan;
}

void Trainer::State::open_data(bool resuming, at::Device device,
                               const std::function<void(const std::string&)>& on_info) {
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
  // One batch size from here on: the settings, the plan's step shape and the record all hold the data's.
  run.train.batch_size(data->global_batch());
  config = recorded_config(ResolvedRun{config, run});
  plan = RunPlan::of(run, *data, device);
  data->set_end_step(plan.total_steps);
}

void Trainer::State::build_model_and_average() {
  auto& model = modules.model;
  model = build_model(run, config, data->channels());
  model->to(plan.device);
  if (run.train.ema_decay() > 0) {
    // Its initial weights are replaced by the model's: built without drawing from torch's generator,
    // so a run with an average trains exactly as one without.
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor before = generator.get_state();
    modules.ema_model = build_model(run, config, data->channels());
    generator.set_state(before);
    modules.ema_model->to(plan.device);
    modules.ema_model->eval();
  }
  const int64_t f = model->options().downsampling();
  for (const auto& size : data->image_sizes()) {
    LOCKSTEP_CHECK_ARG(size.width % f == 0 && size.height % f == 0, "training images of ", size.width, "x", size.height,
                       " cannot pass through the model's ", model->options().channels().size(),
                       " levels: each side must be a multiple of ", f, " (",
                       run.data.dataset() == "folder" ? "change data.buckets, or " : "",
                       "use fewer model.channels entries)");
  }
}

void Trainer::State::check_step_fits(const StepLosses& losses) const {
  const StepGeometry& geometry = plan.geometry;
  if (plan.device.is_cpu()) {
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
          detail::concat("a training step on ", per_pass, " images of ", size.width, "x", size.height,
                         geometry.sharded() ? " per pass" : " per rank", " (train.batch_size = ", geometry.global_batch,
                         ", train.grad_accum = ", geometry.micro_batches,
                         geometry.sharded() ? detail::concat(", train.shard_size = ", geometry.shard_size,
                                                             ", whose gradients each rank keeps")
                                            : std::string(),
                         "; lower the batch, accumulate over more micro-batches, or lower the image size)"));
    }
  }
}

StepLosses Trainer::State::build_losses(int64_t channels) {
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
      lpips->to(plan.device);
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
      fid->to(plan.device);
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
  modules.adversary = std::make_unique<Adversary>(options, channels, group, plan.device);
  for (const auto& size : data->image_sizes()) {
    modules.adversary->discriminator().check_image_size(size.height, size.width);
  }
  return losses;
}

at::Device Trainer::State::choose_device(const std::function<void(const std::string&)>& on_info) const {
  const std::string spec = run.train.device();
  const int index = cuda_index_for(parse_device_spec(spec));
  const at::Device device =
      index < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  LOCKSTEP_CHECK_ARG(group->carries(device), "rank ", group->rank(), " of ", group->size(), ": train.device = ", spec,
                     " puts this rank on ", device, ", but its process group (", group->describe(),
                     ") carries no tensors there; a distributed run on CUDA needs a group made with "
                     "GroupOptions::cuda_device = ",
                     index, " (lockstep train does this)");
  if (on_info && is_root() && index >= 0) {
    on_info(distributed() ? detail::concat("rank 0 trains on ", device, " (each rank on its train.device)")
                          : detail::concat("training on ", device));
  }
  return device;
}

}  // namespace lockstep::train
