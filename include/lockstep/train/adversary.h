// The adversarial side of training (loss.adversarial > 0): a PatchGAN discriminator with its own
// optimizer and checked gradient sync, the GAN objectives, VQGAN's adaptive weight and LeCam
// regularisation. Every collective it issues happens on every rank at the same point of a step.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/group.h"
#include "lockstep/model/discriminator.h"
#include "lockstep/train/adam.h"
#include "lockstep/train/grad_sync.h"

namespace lockstep::train {

struct AdversaryOptions {
  double weight = 0.1;                // loss.adversarial: the adversarial term's weight
  std::string objective = "hinge";    // or "non_saturating"
  int64_t start_step = 0;             // steps (1-based) before this one train without it
  bool adaptive_weight = true;        // scale by |grad nll| / |grad adversarial| at the decoder's last layer
  double lecam = 0;                   // LeCam regularisation weight; 0: none
  double lr = 1e-4;                   // the discriminator's learning rate
  int64_t channels = 64, layers = 3;  // the discriminator's shape
  int64_t bucket_bytes = 1 << 20;     // its gradient buckets
  bool bfloat16 = false;              // its forward under autocast to bfloat16 (train.precision)
};

// What one step of the adversary did, for the metrics.
struct AdversaryFacts {
  double disc_loss = 0;  // the discriminator's loss over the global batch (LeCam term included)
  double factor = 0;     // the weight the adversarial loss entered the model's loss with
};

class Adversary {
 public:
  // Builds the discriminator from torch's generator (on the CPU, then moved to `device`).
  Adversary(const AdversaryOptions& options, int64_t in_channels, std::shared_ptr<dist::Group> group,
            at::Device device);
  ~Adversary();

  // Whether step `step` (1-based) trains the discriminator and adds the adversarial loss.
  bool active(int64_t step) const { return step >= options_.start_step; }

  // The model's adversarial loss on its reconstructions, a mean over the batch; the discriminator
  // is held fixed (no gradient reaches its weights).
  at::Tensor generator_loss(const at::Tensor& reconstruction);
  // The adversarial loss's factor: the weight, times (adaptive) |grad nll| / (|grad adv| + 1e-4) at
  // `last_layer`, clamped to [0, 1e4]. `nll` and `adv` are this rank's weighted losses; their
  // gradients are summed over the ranks first (one all-reduce), so every rank gets the global figure.
  double factor(const at::Tensor& nll, const at::Tensor& adv, const at::Tensor& last_layer);
  // One optimizer step of the discriminator on real images and (detached) reconstructions, one
  // pair per micro-batch (gradients accumulated over them). `rank_weights` scale this rank's losses
  // as the model's are scaled, so that the mean over ranks of the summed gradients is the global
  // batch's. Returns the global loss.
  double train_step(const std::vector<at::Tensor>& reals, const std::vector<at::Tensor>& fakes,
                    const std::vector<double>& rank_weights);
  double train_step(const at::Tensor& real, const at::Tensor& fake, double rank_weight) {
    return train_step(std::vector<at::Tensor>{real}, std::vector<at::Tensor>{fake}, std::vector<double>{rank_weight});
  }

  model::DiscriminatorImpl& discriminator() { return *discriminator_; }
  Adam& optimizer() { return *adam_; }

 private:
  AdversaryOptions options_;
  std::shared_ptr<dist::Group> group_;
  c10::DeviceType device_type_;
  model::Discriminator discriminator_{nullptr};
  std::unique_ptr<Adam> adam_;
  std::unique_ptr<GradientSync> sync_;
};

}  // namespace lockstep::train
