// The one global plan of batches (G5): which samples make up global batch t of an epoch,
// from which bucket, as a pure function of (bucket contents, seed, epoch, global batch size). Every
// rank computes the same plan and takes its slice of each global batch, so all ranks run the same
// number of steps, at each step on the same bucket (resolution); resuming at any (epoch, step), on
// any number of ranks, continues the same sequence. Nothing here depends on torch or on the
// standard library's random distributions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::data {

// What happens to the last, partial global batch of a bucket in an epoch.
enum class Remainder {
  Drop,  // left out this epoch (each epoch's shuffle leaves out different samples)
  Pad,   // completed with the first samples of the same bucket's shuffled order (distinct from the
         // partial batch's, since a bucket holds at least one global batch)
};
const char* remainder_name(Remainder r);

struct PlanOptions {
  int64_t global_batch = 64;
  uint64_t seed = 0;
  Remainder remainder = Remainder::Drop;
  // Gradient accumulation: each global batch is cut into this many consecutive micro-batches of
  // equal size, and each rank takes its part of each one, so that micro-batch j is the same
  // samples on any number of ranks. 1: the global batch is one micro-batch.
  int64_t micro_batches = 1;
  // Ranks hold whole shards of this many samples (train.shard_size): each micro-batch is cut into
  // shards, and each rank's part is a contiguous run of them. 1: any split.
  int64_t shard_size = 1;
};

struct PlannedBatch {
  int64_t bucket = 0;
  std::vector<int64_t> samples;  // global_batch sample ids, in the order ranks slice them
};

class EpochPlan {
 public:
  // buckets[b]: the sample ids of bucket b (ids are the caller's, e.g. manifest rows; order does not
  // matter: each bucket is sorted first). Throws InvalidArgument naming the bucket when a non-empty
  // bucket holds fewer samples than one global batch, and when no bucket can fill one.
  EpochPlan(std::vector<std::vector<int64_t>> buckets, const PlanOptions& options, int64_t epoch);

  int64_t steps() const { return static_cast<int64_t>(order_.size()); }
  // Global batch `step` of the epoch (0 <= step < steps()).
  PlannedBatch batch(int64_t step) const;
  // This rank's part of global batch `step`: the samples at rank_slots(), micro-batch by micro-batch.
  std::vector<int64_t> rank_part(int64_t step, int world_size, int rank) const;
  // Where `rank`'s part starts in a global batch of `global_batch` split over `world_size` ranks
  // in whole shards of `shard` samples.
  static int64_t rank_offset(int64_t global_batch, int world_size, int rank, int64_t shard = 1);
  // The positions in the global batch of `rank`'s samples: of each micro-batch (consecutive
  // global_batch / micro_batches positions) a contiguous part of whole shards, in rank order, the
  // first (shards per micro-batch) % world ranks holding one shard more (the trainer's split).
  // Throws InvalidArgument when micro_batches does not divide global_batch, the shard size does
  // not divide a micro-batch, or a micro-batch would leave a rank without a shard.
  static std::vector<int64_t> rank_slots(int64_t global_batch, int64_t micro_batches, int world_size, int rank,
                                         int64_t shard = 1);
  // How many of `rank`'s samples fall in each micro-batch.
  static std::vector<int64_t> rank_micro_counts(int64_t global_batch, int64_t micro_batches, int world_size, int rank,
                                                int64_t shard = 1);
  // A hash of the whole epoch's sequence (buckets and samples), for ranks to compare at the start
  // of each epoch and for pinned-value tests.
  uint64_t hash() const;

 private:
  std::vector<std::vector<int64_t>> shuffled_;      // per bucket, this epoch's order
  std::vector<std::pair<int64_t, int64_t>> order_;  // per step: (bucket, batch index within it)
  PlanOptions options_;
};

}  // namespace lockstep::data
