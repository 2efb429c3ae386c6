// What a run is, decided once from its resolved settings, its group and its data (RunPlan::of, in
// trainer_build.cpp): where this rank trains, the step's shape and how many steps. The trainer holds it; the
// step runner, the memory check and the report read it. Internal to src/train.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "lockstep/train/step_geometry.h"

namespace lockstep::train {

struct RunSettings;
class TrainData;

struct RunPlan {
  at::Device device{at::kCPU};  // train.device, resolved for this rank
  StepGeometry geometry;        // of the data's global batch (the settings' train.batch_size once it is open)
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 0;  // train.steps, else train.epochs x steps_per_epoch

  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch; }
  int64_t global_batch() const { return geometry.global_batch; }

  // The plan of `run` (its batch size already the data's) on `device` over `data`.
  static RunPlan of(const RunSettings& run, const TrainData& data, at::Device device);
};

}  // namespace lockstep::train
