#include "lockstep/data/plan.h"

#include <algorithm>

#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/core/random.h"

namespace lockstep::data {
namespace {
constexpr uint64_t kBucketShuffle = +SeedPurpose::BucketShuffle;
constexpr uint64_t kBatchOrder = +SeedPurpose::BatchOrder;

}  // namespace

const char* remainder_name(Remainder r) { return r == Remainder::Drop ? "drop" : "pad"; }

EpochPlan::EpochPlan(std::vector<std::vector<int64_t>> buckets, const PlanOptions& options, int64_t epoch)
    : options_(options) {
  const int64_t b = options.global_batch;
  LOCKSTEP_CHECK_ARG(b >= 1, "data plan: global batch ", b, " must be >= 1");
  LOCKSTEP_CHECK_ARG(epoch >= 0, "data plan: epoch ", epoch, " must be >= 0");
  std::vector<int64_t> batches_of;
  for (size_t k = 0; k < buckets.size(); ++k) {
    auto& ids = buckets[k];
    const auto n = static_cast<int64_t>(ids.size());
    LOCKSTEP_CHECK_ARG(n == 0 || n >= b, "data plan: bucket ", k, " holds ", n, " samples, fewer than one global ",
                       "batch of ", b, "; lower the global batch, merge buckets, or add images");
    std::sort(ids.begin(), ids.end());  // the plan must not depend on the order ids were listed in
    const std::vector<int64_t> perm =
        permutation(n, derive_seed(options.seed, static_cast<uint64_t>(epoch), kBucketShuffle * 1000003 + k));
    std::vector<int64_t> shuffled(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      shuffled[static_cast<size_t>(i)] = ids[static_cast<size_t>(perm[static_cast<size_t>(i)])];
    const int64_t full = n / b;
    const bool pad = options.remainder == Remainder::Pad && n % b != 0;
    batches_of.push_back(full + (pad ? 1 : 0));
    shuffled_.push_back(std::move(shuffled));
  }
  for (size_t k = 0; k < batches_of.size(); ++k) {
    for (int64_t j = 0; j < batches_of[k]; ++j) order_.emplace_back(static_cast<int64_t>(k), j);
  }
  LOCKSTEP_CHECK_ARG(!order_.empty(), "data plan: no bucket holds a global batch of ", b, " samples (", buckets.size(),
                     " buckets)");
  // Buckets interleave: the list of (bucket, batch) is shuffled as a whole.
  const std::vector<int64_t> perm = permutation(static_cast<int64_t>(order_.size()),
                                                derive_seed(options.seed, static_cast<uint64_t>(epoch), kBatchOrder));
  std::vector<std::pair<int64_t, int64_t>> shuffled_order(order_.size());
  for (size_t i = 0; i < order_.size(); ++i) shuffled_order[i] = order_[static_cast<size_t>(perm[i])];
  order_ = std::move(shuffled_order);
}

PlannedBatch EpochPlan::batch(int64_t step) const {
  LOCKSTEP_CHECK_ARG(step >= 0 && step < steps(), "data plan: step ", step, " outside [0, ", steps(), ")");
  const auto [bucket, j] = order_[static_cast<size_t>(step)];
  const auto& ids = shuffled_[static_cast<size_t>(bucket)];
  const int64_t b = options_.global_batch;
  const auto n = static_cast<int64_t>(ids.size());
  PlannedBatch out;
  out.bucket = bucket;
  for (int64_t i = j * b; i < (j + 1) * b; ++i) out.samples.push_back(ids[static_cast<size_t>(i < n ? i : i - n)]);
  return out;
}

int64_t EpochPlan::rank_offset(int64_t global_batch, int world_size, int rank, int64_t shard) {
  const int64_t shards = global_batch / shard;
  const int64_t base = shards / world_size, extra = shards % world_size;
  return shard * (rank * base + std::min<int64_t>(rank, extra));
}

std::vector<int64_t> EpochPlan::rank_micro_counts(int64_t global_batch, int64_t micro_batches, int world_size, int rank,
                                                  int64_t shard) {
  LOCKSTEP_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size, "data plan: rank ", rank, " of a world of ",
                     world_size);
  LOCKSTEP_CHECK_ARG(micro_batches >= 1 && global_batch % micro_batches == 0, "data plan: a global batch of ",
                     global_batch, " cannot be cut into ", micro_batches, " micro-batches of equal size");
  const int64_t micro = global_batch / micro_batches;
  const char* what = micro_batches > 1 ? "micro-batch" : "global batch";
  LOCKSTEP_CHECK_ARG(shard >= 1 && micro % shard == 0, "data plan: a ", what, " of ", micro,
                     " cannot be cut into shards of train.shard_size = ", shard);
  const int64_t shards = micro / shard;
  if (shard == 1) {
    LOCKSTEP_CHECK_ARG(micro >= world_size, "data plan: a ", what, " of ", micro, " cannot give each of ", world_size,
                       " ranks a sample");
  } else {
    LOCKSTEP_CHECK_ARG(shards >= world_size, "data plan: a ", what, " of ", micro, " in shards of ", shard, " (",
                       shards, ") cannot give each of ", world_size, " ranks a shard");
  }
  const int64_t count = shard * (shards / world_size + (rank < shards % world_size ? 1 : 0));
  return std::vector<int64_t>(static_cast<size_t>(micro_batches), count);
}

std::vector<int64_t> EpochPlan::rank_slots(int64_t global_batch, int64_t micro_batches, int world_size, int rank,
                                           int64_t shard) {
  const std::vector<int64_t> counts = rank_micro_counts(global_batch, micro_batches, world_size, rank, shard);
  const int64_t micro = global_batch / micro_batches;
  std::vector<int64_t> slots;
  for (int64_t j = 0; j < micro_batches; ++j) {
    const int64_t first = j * micro + rank_offset(micro, world_size, rank, shard);
    for (int64_t i = 0; i < counts[static_cast<size_t>(j)]; ++i) slots.push_back(first + i);
  }
  return slots;
}

std::vector<int64_t> EpochPlan::rank_part(int64_t step, int world_size, int rank) const {
  const PlannedBatch all = batch(step);
  std::vector<int64_t> out;
  for (int64_t slot :
       rank_slots(options_.global_batch, options_.micro_batches, world_size, rank, options_.shard_size)) {
    out.push_back(all.samples[static_cast<size_t>(slot)]);
  }
  return out;
}

uint64_t EpochPlan::hash() const {
  uint64_t h = kFnv1aOffset;
  for (int64_t s = 0; s < steps(); ++s) {
    const PlannedBatch p = batch(s);
    h = fnv1a_int64(p.bucket, h);
    for (int64_t id : p.samples) h = fnv1a_int64(id, h);
  }
  return h;
}

}  // namespace lockstep::data
