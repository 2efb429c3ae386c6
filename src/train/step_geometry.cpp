#include "lockstep/train/step_geometry.h"

#include <string>

#include "lockstep/core/error.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::train {

StepGeometry StepGeometry::of(const TrainSettings& train) {
  return StepGeometry{train.batch_size(), train.grad_accum(), train.shard_size()};
}

void StepGeometry::check() const {
  LOCKSTEP_CHECK_ARG(global_batch % micro_batches == 0, "train.grad_accum = ", micro_batches,
                     " must divide train.batch_size = ", global_batch,
                     " (each step's global batch is cut into micro-batches of equal size)");
  LOCKSTEP_CHECK_ARG(!sharded() || micro_batch() % shard_size == 0, "train.shard_size = ", shard_size,
                     " must divide the ", micro_batches > 1 ? "micro-batch" : "global batch", " of ", micro_batch(),
                     " (ranks hold whole shards)");
}

void StepGeometry::check_ranks(int64_t world) const {
  const bool accumulates = micro_batches > 1;
  LOCKSTEP_CHECK_ARG(
      micro_batch() >= world, "train.batch_size = ", global_batch, " is the global batch",
      accumulates ? ::lockstep::detail::concat(", cut into ", micro_batches, " micro-batches of ", micro_batch())
                  : std::string(),
      ": it needs at least one image for each of the ", world, " ranks", accumulates ? " in each micro-batch" : "");
  LOCKSTEP_CHECK_ARG(unit() == 1 || micro_batch() / unit() >= world, "train.batch_size = ", global_batch,
                     accumulates ? ::lockstep::detail::concat(" in micro-batches of ", micro_batch()) : std::string(),
                     " holds ", micro_batch() / unit(), " shards of train.shard_size = ", unit(),
                     accumulates ? " each" : "", ": it needs at least one for each of the ", world, " ranks");
}

}  // namespace lockstep::train
