// One optimizer step of a run on this rank's part of the global batch: the forward passes over the
// micro-batches, the loss weighted for the global batch (G4), gradients averaged over the ranks
// during backward, clipping, the optimizer, the buffers' sync, the weight average and the
// discriminator's step.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/group.h"
#include "lockstep/model/lpips.h"
#include "lockstep/quant/quantizer.h"
#include "lockstep/train/grad_sync.h"
#include "lockstep/train/losses.h"
#include "lockstep/train/lr_schedule.h"
#include "lockstep/train/run_settings.h"
#include "lockstep/train/step_geometry.h"
#include "run_report.h"
#include "train_data.h"
#include "trained_modules.h"

namespace lockstep::train {

// The losses a step computes besides the quantizer's.
struct StepLosses {
  ReconstructionLossOptions reconstruction;  // loss.l2, loss.l1, loss.perceptual
  model::Lpips lpips{nullptr};               // the perceptual loss's network, when loss.perceptual > 0
  bool bfloat16 = false;                     // train.precision
};

class StepRunner {
 public:
  // `modules` (built, on their device) must outlive the runner. `step`: the run's step geometry (its
  // global batch one an image folder may have chosen). `total_steps` stretches the learning-rate schedule.
  StepRunner(std::shared_ptr<dist::Group> group, const RunSettings& settings, StepGeometry step, int64_t total_steps,
             TrainedModules& modules, StepLosses losses);

  // Step `step` + 1 on `batch`, this rank's part of its global batch. `stop_requested` (may be
  // null): set when this rank is asked to stop; it is read as late as the step allows (just before
  // the step's last backward, whose gradients carry it), and the returned `stop` is true when any
  // rank was asked (every rank sees the same).
  // `logged`: the step's metrics are written, so its gradient norm is wanted even without
  // clipping. Throws TrainingDiverged before the parameters change when the loss is not finite;
  // `diverged_note` then says what the run directory still holds.
  StepFacts take(int64_t step, const StepBatch& batch, const at::Device& device,
                 const std::atomic<bool>* stop_requested, bool logged, bool* stop,
                 const std::function<std::string()>& diverged_note);

 private:
  struct StepControl;
  // What the discriminator's step takes from the generator's: per micro-batch.
  struct DiscriminatorInputs {
    std::vector<at::Tensor> reals, fakes;
    std::vector<double> weights;
    double factor_sum = 0;  // the adaptive factors, summed
  };
  // Each micro-batch's part as one forward and backward; gradients averaged over the ranks by the
  // GradientSync during backward. Returns `here` summed over the ranks.
  StepControl gradients(int64_t step, const at::Tensor& images, StepControl here, bool adversarial,
                        DiscriminatorInputs* disc);
  // train.shard_size: each shard its own forward and backward, gradients and loss summed exactly
  // (dist::ExactSum), the quantizer's state updated once per micro-batch. Returns `here` summed, its
  // loss the global batch's.
  StepControl sharded_gradients(int64_t step, const at::Tensor& images, StepControl here);
  void sync_buffers();

  std::shared_ptr<dist::Group> group_;
  RunSettings settings_;
  StepGeometry step_;
  TrainedModules& modules_;
  StepLosses losses_;
  at::Tensor decoder_last_weight_;  // where the adaptive weight compares gradients
  std::vector<at::Tensor> trained_params_;
  std::vector<at::Tensor> differentiated_params_;  // those that take gradients (in shards, ExactSum's pieces)
  std::vector<at::Tensor> local_buffers_;          // float buffers outside the quantizer (BatchNorm statistics)
  std::unique_ptr<quant::Reducer> reducer_;        // quantizer statistics over the global batch
  std::unique_ptr<GradientSync> grad_sync_;        // gradients averaged over the ranks during backward
  std::unique_ptr<LrSchedule> lr_schedule_;        // the rate of each step, from the step alone
};

}  // namespace lockstep::train
