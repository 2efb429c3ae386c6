// The shape of one training step, decoded once from train.batch_size, train.grad_accum and
// train.shard_size (run_settings.h) for every part of a run that cuts a batch: the data plan, the
// step runner and the memory check.
#pragma once

#include <cstdint>

namespace lockstep::train {

struct TrainSettings;

struct StepGeometry {
  int64_t global_batch = 1;   // samples per optimizer step, over every rank
  int64_t micro_batches = 1;  // forward and backward passes per step (train.grad_accum)
  int64_t shard_size = 0;     // train.shard_size; 0: a rank's part of a micro-batch is one pass

  // The settings' geometry, train.batch_size the global batch.
  static StepGeometry of(const TrainSettings& train);

  int64_t micro_batch() const { return global_batch / micro_batches; }
  bool sharded() const { return shard_size > 0; }
  // The fewest samples a rank holds of a micro-batch: a shard, else one sample.
  int64_t unit() const { return sharded() ? shard_size : 1; }
  // The most samples a rank holds of a micro-batch among `world` ranks: a pass without shards.
  int64_t most_per_rank(int64_t world) const { return (micro_batch() + world - 1) / world; }
  // The shards a rank passes over (and keeps gradients for) in a step, at most, among `world` ranks.
  int64_t shards_per_rank(int64_t world) const {
    return micro_batches * ((micro_batch() / unit() + world - 1) / world);
  }

  // InvalidArgument unless train.grad_accum divides the global batch and train.shard_size each
  // micro-batch (ranks hold whole shards).
  void check() const;
  // InvalidArgument unless each micro-batch holds at least one sample (one shard) for each of `world` ranks.
  void check_ranks(int64_t world) const;
};

}  // namespace lockstep::train
