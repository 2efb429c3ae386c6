#include "step_runner.h"

#include <torch/torch.h>

#include <cmath>
#include <optional>

#include "lockstep/core/error.h"
#include "lockstep/dist/group_reducer.h"
#include "lockstep/quant/autocast.h"
#include "lockstep/quant/call_context.h"
#include "lockstep/train/grad_clip.h"
#include "lockstep/train/trainer.h"
#include "lockstep/train/weight_ema.h"

namespace lockstep::train {
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

StepRunner::StepRunner(std::shared_ptr<dist::Group> group, const RunSettings& settings, int64_t global_batch,
                       int64_t total_steps, TrainedModules& modules, StepLosses losses)
    : group_(std::move(group)),
      settings_(settings),
      global_batch_(global_batch),
      modules_(modules),
      losses_(std::move(losses)) {
  // One step path for any number of ranks: a group of one makes every collective an identity.
  reducer_ = std::make_unique<dist::GroupReducer>(group_);
  for (const auto& b : modules_.model->named_buffers(true)) {
    if (b.key().rfind("quantizer.", 0) != 0 && b.value().is_floating_point()) local_buffers_.push_back(b.value());
  }
  trained_params_ = modules_.model->parameters(true);
  grad_sync_ = std::make_unique<GradientSync>(group_, trained_params_, settings_.train.grad_bucket_kb() * 1024);
  if (modules_.adversary) decoder_last_weight_ = modules_.model->output_weight();
  // A resumed run that extends train.steps stretches the decay over the new total from then on.
  lr_schedule_ = std::make_unique<LrSchedule>(LrScheduleOptions()
                                                  .lr(settings_.train.lr())
                                                  .warmup_steps(settings_.train.warmup_steps())
                                                  .decay(settings_.train.lr_decay())
                                                  .final_ratio(settings_.train.lr_final_ratio()),
                                              total_steps);
}

// Buffers that follow each rank's own batch are averaged over ranks here, after the optimizer
// step: the one defined point where they synchronise (never as a side effect of forward).
// Quantizer state needs none: it is updated from global statistics.
void StepRunner::sync_buffers() {
  if (local_buffers_.empty()) return;
  torch::NoGradGuard no_grad;
  group_->all_reduce(local_buffers_, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("train.buffers"));
  for (auto& b : local_buffers_) b.div_(group_->size());
}

StepFacts StepRunner::take(int64_t step, const StepBatch& batch, const at::Device& device, bool stop_here, bool logged,
                           bool* stop, const std::function<std::string()>& diverged_note) {
  const at::Tensor images = batch.images.to(device);
  // Gradient accumulation: micro-batch j is the same images on any number of ranks (the plan
  // gives each rank its part of each), so each forward's statistics are a global micro-batch's.
  const int64_t micro_batches = settings_.train.grad_accum();
  const std::vector<int64_t> counts =
      data::EpochPlan::rank_micro_counts(global_batch_, micro_batches, group_->size(), group_->rank());
  const bool adversarial = modules_.adversary && modules_.adversary->active(step + 1);
  StepFacts facts;
  // This rank's loss, stop request and replaced images travel summed with the last gradient
  // bucket, so every rank stops after the same step, whichever rank was asked.
  StepControl here;
  here.stop = stop_here;
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
        static_cast<uint64_t>(settings_.train.seed()), static_cast<uint64_t>(step * micro_batches + j),
        data::EpochPlan::rank_offset(global_batch_ / micro_batches, group_->size(), group_->rank()));
    ctx.reducer = reducer_.get();
    // The loss is weighted so that averaging gradients over ranks (and summing over micro-batches)
    // gives exactly the gradient of the global batch's loss (G4).
    const double weight = static_cast<double>(x.size(0)) * group_->size() / static_cast<double>(global_batch_);
    at::Tensor reconstruction, nll, loss, g_loss;
    {
      // train.precision = losses_.bfloat16: the forward under autocast (the quantizer opts out); backward
      // and everything after it outside.
      std::optional<quant::Autocast> bf16;
      if (losses_.bfloat16) bf16.emplace(device.type(), at::kBFloat16);
      const model::AutoencoderOutput out = modules_.model->forward(x, ctx);
      reconstruction = out.reconstruction.to(at::kFloat);
      nll = reconstruction_loss(reconstruction, x, losses_.reconstruction,
                                losses_.lpips.is_empty() ? nullptr : losses_.lpips.get());
      loss = nll + out.quant.total_loss();
      if (adversarial) g_loss = modules_.adversary->generator_loss(reconstruction);
    }
    if (adversarial) {
      // The factor's gradients are not the step's: the sync (begun by an earlier micro-batch) ignores them.
      const GradientSync::Paused paused(*grad_sync_);
      const double factor = modules_.adversary->factor(nll * weight, g_loss * weight, decoder_last_weight_);
      factor_sum += factor;
      loss = loss + g_loss * factor;
      reals.push_back(x);
      fakes.push_back(reconstruction.detach());
      weights.push_back(weight);
    }
    loss = loss * weight;
    here.loss += loss.item<double>();
    if (j == 0) {
      grad_sync_->begin_accumulation(micro_batches);
      modules_.adam->zero_grad();
    }
    if (j == micro_batches - 1) grad_sync_->set_control(here.pack());
    loss.backward();
  }
  const StepControl all = StepControl::unpack(grad_sync_->finish());  // gradients now the mean over ranks
  facts.loss = all.loss / group_->size();
  facts.replaced = all.replaced;
  facts.waited_s = batch.waited_s;
  facts.image_width = images.size(3);
  facts.image_height = images.size(2);
  // Every rank sees the same summed loss, so every rank stops here together; nothing of this
  // step reaches the parameters or the checkpoint.
  LOCKSTEP_THROW_IF_NOT(std::isfinite(facts.loss), TrainingDiverged, "step ", step + 1, ": the loss is ", facts.loss,
                        ": training diverged (train.lr is ", settings_.train.lr(), "; a lower one may help). ",
                        diverged_note());
  // The gradients are the same on every rank now, so are their norm and the clipping.
  const double clip = settings_.train.grad_clip();
  if (clip > 0) {
    facts.grad_norm = clip_grad_norm(trained_params_, clip);
  } else if (logged) {
    facts.grad_norm = global_grad_norm(trained_params_);
  }
  facts.lr = lr_schedule_->at(step + 1);
  modules_.adam->set_lr(facts.lr);
  modules_.adam->step();
  sync_buffers();
  if (modules_.ema_model) update_weight_ema(*modules_.ema_model, *modules_.model, settings_.train.ema_decay());
  if (adversarial) {
    facts.disc_loss = modules_.adversary->train_step(reals, fakes, weights);
    facts.adversarial_factor = factor_sum / static_cast<double>(micro_batches);
  }
  facts.adversary = modules_.adversary != nullptr;
  *stop = all.stop;
  return facts;
}

}  // namespace lockstep::train
