#include "step_runner.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <optional>

#include "lockstep/core/error.h"
#include "lockstep/dist/exact_sum.h"
#include "lockstep/dist/group_reducer.h"
#include "lockstep/quant/autocast.h"
#include "lockstep/quant/call_context.h"
#include "lockstep/quant/initialisation.h"
#include "lockstep/train/grad_clip.h"
#include "lockstep/train/trainer.h"
#include "lockstep/train/weight_ema.h"

namespace lockstep::train {

// What travels with the last gradient bucket of every step, summed over the ranks.
struct StepRunner::StepControl {
  double loss = 0;       // each rank's (weighted) loss; summed, divide by the ranks for the mean
  bool stop = false;     // a rank was asked to stop (Ctrl-C, SIGTERM); summed: any rank was
  int64_t replaced = 0;  // images that failed to decode and were replaced; summed
  // This rank's stop request, read when the control is packed: as late in the step as it can be.
  const std::atomic<bool>* stop_requested = nullptr;

  at::Tensor pack() const {
    const bool stopping = stop || (stop_requested && stop_requested->load());
    return torch::tensor({static_cast<float>(loss), stopping ? 1.0f : 0.0f, static_cast<float>(replaced)});
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

namespace {

// The reducer of a shard's quantizer call (train.shard_size): a quantizer whose forward takes
// statistics of the whole batch (LFQ's entropy, FSP's moments) cannot be split into shards.
class ShardsTakeNoBatchSums final : public quant::Reducer {
 public:
  explicit ShardsTakeNoBatchSums(int64_t shard_size) : shard_size_(shard_size) {}
  void sum_(std::vector<at::Tensor>&, const CallSite& site) override { refuse(site); }
  at::Tensor sum(const at::Tensor&, const CallSite& site) override { refuse(site); }
  at::Tensor gather(const at::Tensor&, const CallSite& site) override { refuse(site); }

 private:
  [[noreturn]] void refuse(const CallSite& site) const {
    LOCKSTEP_THROW_IF_NOT(false, InvalidArgument, "train.shard_size = ", shard_size_,
                          ": this quantizer's forward takes statistics of the whole batch (", site.to_string(),
                          "), which passes over shards cannot split; set train.shard_size = 0");
    std::abort();  // unreachable: the macro throws
  }
  int64_t shard_size_;
};

}  // namespace

StepRunner::StepRunner(std::shared_ptr<dist::Group> group, const RunSettings& settings, StepGeometry step,
                       int64_t total_steps, TrainedModules& modules, StepLosses losses)
    : group_(std::move(group)), settings_(settings), step_(step), modules_(modules), losses_(std::move(losses)) {
  // One step path for any number of ranks: a group of one makes every collective an identity.
  reducer_ = std::make_unique<dist::GroupReducer>(group_);
  for (const auto& b : modules_.model->named_buffers(true)) {
    if (b.key().rfind("quantizer.", 0) != 0 && b.value().is_floating_point()) local_buffers_.push_back(b.value());
  }
  trained_params_ = modules_.model->parameters(true);
  for (const at::Tensor& p : trained_params_) {
    if (p.requires_grad()) differentiated_params_.push_back(p);
  }
  // In shards, gradients are summed exactly once all shards are done (sharded_gradients).
  if (!step_.sharded()) {
    grad_sync_ = std::make_unique<GradientSync>(group_, trained_params_, settings_.train.grad_bucket_kb() * 1024);
  }
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

StepRunner::StepControl StepRunner::gradients(int64_t step, const at::Tensor& images, StepControl here,
                                              bool adversarial, DiscriminatorInputs* disc) {
  // Gradient accumulation: micro-batch j is the same images on any number of ranks (the plan
  // gives each rank its part of each), so each forward's statistics are a global micro-batch's.
  const int64_t micro_batches = step_.micro_batches;
  const std::vector<int64_t> counts =
      data::EpochPlan::rank_micro_counts(step_.global_batch, micro_batches, group_->size(), group_->rank());
  int64_t first = 0;
  for (int64_t j = 0; j < micro_batches; ++j) {
    const at::Tensor x = images.narrow(0, first, counts[static_cast<size_t>(j)]);
    first += x.size(0);
    // Quantizer randomness (k-means seeds, dead-code samples) comes from a generator that is a pure
    // function of (seed, step, micro-batch): the same on every rank and after a resume, with no collective.
    quant::QuantizeContext ctx = quant::seeded_context(
        static_cast<uint64_t>(settings_.train.seed()), static_cast<uint64_t>(step * micro_batches + j),
        data::EpochPlan::rank_offset(step_.micro_batch(), group_->size(), group_->rank()));
    ctx.reducer = reducer_.get();
    // The loss is weighted so that averaging gradients over ranks (and summing over micro-batches)
    // gives exactly the gradient of the global batch's loss (G4).
    const double weight = static_cast<double>(x.size(0)) * group_->size() / static_cast<double>(step_.global_batch);
    at::Tensor reconstruction, nll, loss, g_loss;
    {
      // train.precision = losses_.bfloat16: the forward under autocast (the quantizer opts out); backward
      // and everything after it outside.
      std::optional<quant::Autocast> bf16;
      if (losses_.bfloat16) bf16.emplace(images.device().type(), at::kBFloat16);
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
      disc->factor_sum += factor;
      loss = loss + g_loss * factor;
      disc->reals.push_back(x);
      disc->fakes.push_back(reconstruction.detach());
      disc->weights.push_back(weight);
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
  return StepControl::unpack(grad_sync_->finish());  // gradients now the mean over ranks
}

StepRunner::StepControl StepRunner::sharded_gradients(int64_t step, const at::Tensor& images, StepControl here) {
  const int64_t micro_batches = step_.micro_batches;
  const int64_t shard = step_.shard_size;
  const int64_t micro = step_.micro_batch();
  const int world = group_->size(), rank = group_->rank();
  const std::vector<int64_t> counts =
      data::EpochPlan::rank_micro_counts(step_.global_batch, micro_batches, world, rank, shard);
  quant::Quantizer& quantizer = modules_.model->quantizer();
  ShardsTakeNoBatchSums no_batch_sums(shard);
  // One piece per shard: the gradient of every parameter that takes one, then the shard's loss.
  std::vector<std::vector<int64_t>> shapes;
  for (const at::Tensor& p : differentiated_params_) shapes.push_back(p.sizes().vec());
  shapes.push_back({});
  dist::ExactSum sum(group_, shapes, step_.global_batch / shard, images.device());
  // A shard's loss weighs as its share of the global batch, the same factor on any number of ranks.
  const double share = static_cast<double>(shard) / static_cast<double>(step_.global_batch);
  const int64_t offset = data::EpochPlan::rank_offset(micro, world, rank, shard);  // in each micro-batch
  int64_t first = 0;
  for (int64_t j = 0; j < micro_batches; ++j) {
    const at::Tensor x = images.narrow(0, first, counts[static_cast<size_t>(j)]);
    first += x.size(0);
    // Every pass over micro-batch j draws as one pass over all of it would (seeded_context).
    const auto context = [&](int64_t first_item, quant::Reducer* reducer) {
      quant::QuantizeContext ctx = quant::seeded_context(static_cast<uint64_t>(settings_.train.seed()),
                                                         static_cast<uint64_t>(step * micro_batches + j), first_item);
      ctx.reducer = reducer;
      ctx.defer_updates = true;  // the state changes once, after every shard used it as the step found it
      return ctx;
    };
    const int64_t shards = x.size(0) / shard;
    if (quant::awaits_initialisation(quantizer)) {
      // k-means sees the whole micro-batch before any shard is quantized, as in one pass.
      std::vector<at::Tensor> latents;
      for (int64_t k = 0; k < shards; ++k) {
        std::optional<quant::Autocast> bf16;  // train.precision, as in gradients()
        if (losses_.bfloat16) bf16.emplace(images.device().type(), at::kBFloat16);
        latents.push_back(modules_.model->latents(x.narrow(0, k * shard, shard)));
      }
      quantizer.quantize(torch::cat(latents), context(offset, reducer_.get()));
    }
    std::vector<at::Tensor> latents;
    bool updates = false;
    for (int64_t k = 0; k < shards; ++k) {
      const at::Tensor xs = x.narrow(0, k * shard, shard);
      at::Tensor loss;
      {
        std::optional<quant::Autocast> bf16;  // train.precision, as in gradients()
        if (losses_.bfloat16) bf16.emplace(images.device().type(), at::kBFloat16);
        const model::AutoencoderOutput out = modules_.model->forward(xs, context(offset + k * shard, &no_batch_sums));
        const at::Tensor reconstruction = out.reconstruction.to(at::kFloat);
        loss = reconstruction_loss(reconstruction, xs, losses_.reconstruction,
                                   losses_.lpips.is_empty() ? nullptr : losses_.lpips.get()) +
               out.quant.total_loss();
        updates = updates || static_cast<bool>(out.quant.update);
        latents.push_back(out.latents.detach());
      }
      loss = loss * share;
      std::vector<at::Tensor> piece = torch::autograd::grad({loss}, differentiated_params_, /*grad_outputs=*/{},
                                                            /*retain_graph=*/false, /*create_graph=*/false,
                                                            /*allow_unused=*/true);
      piece.push_back(loss.detach());
      sum.add(piece);
    }
    if (updates) {
      // The quantizer's state follows micro-batch j once, from all its tokens (its collectives here).
      const quant::QuantizerOutput whole = quantizer.quantize(torch::cat(latents), context(offset, reducer_.get()));
      if (whole.update) whole.update(*reducer_);
    }
  }
  modules_.adam->zero_grad();
  const std::vector<at::Tensor> summed = sum.finish(LOCKSTEP_CALL_SITE("train.exact_grads"));
  for (size_t i = 0; i < differentiated_params_.size(); ++i) {
    differentiated_params_[i].mutable_grad() = summed[i].to(differentiated_params_[i].device());
  }
  // The stop requests and replaced images (small integers: float sums are exact); the loss is the exact sum's.
  here.loss = 0;
  std::vector<at::Tensor> control{here.pack()};
  group_->all_reduce(control, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("train.control"));
  StepControl all = StepControl::unpack(control[0]);
  all.loss = summed.back().item<double>();
  return all;
}

StepFacts StepRunner::take(int64_t step, const StepBatch& batch, const at::Device& device,
                           const std::atomic<bool>* stop_requested, bool logged, bool* stop,
                           const std::function<std::string()>& diverged_note) {
  const at::Tensor images = batch.images.to(device);
  StepFacts facts;
  // This rank's loss, stop request and replaced images travel summed with the last gradient
  // bucket, so every rank stops after the same step, whichever rank was asked.
  StepControl here;
  here.stop_requested = stop_requested;
  here.replaced = batch.replaced;
  DiscriminatorInputs disc;
  const int64_t micro_batches = step_.micro_batches;
  const bool adversarial = modules_.adversary && modules_.adversary->active(step + 1);
  StepControl all;
  if (step_.sharded()) {
    all = sharded_gradients(step, images, here);
    facts.loss = all.loss;
  } else {
    all = gradients(step, images, here, adversarial, &disc);
    facts.loss = all.loss / group_->size();
  }
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
    facts.disc_loss = modules_.adversary->train_step(disc.reals, disc.fakes, disc.weights);
    facts.adversarial_factor = disc.factor_sum / static_cast<double>(micro_batches);
  }
  facts.adversary = modules_.adversary != nullptr;
  *stop = all.stop;
  return facts;
}

}  // namespace lockstep::train
