// What a run trains and its checkpoint holds: the model, the weights' moving average, the
// optimizer and the adversary. The trainer builds them, the step runner trains them, and
// checkpointing saves and restores them.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/model/autoencoder.h"
#include "lockstep/train/adam.h"
#include "lockstep/train/adversary.h"

namespace lockstep::train {

struct TrainedModules {
  model::Autoencoder model{nullptr};
  model::Autoencoder ema_model{nullptr};  // the weights' moving average, with train.ema_decay > 0
  std::unique_ptr<Adam> adam;
  std::unique_ptr<Adversary> adversary;  // loss.adversarial > 0

  // What every rank holds a copy of: the model, and the discriminator when there is one.
  std::vector<const torch::nn::Module*> replicated() const {
    std::vector<const torch::nn::Module*> modules = {model.get()};
    if (adversary) modules.push_back(&adversary->discriminator());
    return modules;
  }
};

}  // namespace lockstep::train
