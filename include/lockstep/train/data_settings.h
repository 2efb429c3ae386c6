// A configuration's data settings as the data layer's options, for the trainer and for the tools
// that must see a run's data as it trained (lockstep eval, encode).
#pragma once

#include "lockstep/data/plan.h"
#include "lockstep/train/config.h"

namespace lockstep::train {

// train.batch_size (the global batch), train.seed and data.remainder.
data::PlanOptions plan_options(const Config& config);

}  // namespace lockstep::train
