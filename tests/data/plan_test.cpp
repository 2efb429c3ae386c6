// The global data plan's invariants (G5, docs/guarantees.md): the same steps and buckets on every rank, no sample
// twice in a step, coverage within the remainder policy, determinism, resume and elastic resume.
#include "lockstep/data/plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "error_of.h"
#include "lockstep/core/error.h"

namespace lockstep::data {
namespace {

// Three buckets of uneven sizes (ids interleaved, as a manifest would list them) and an empty one.
std::vector<std::vector<int64_t>> example_buckets() {
  std::vector<std::vector<int64_t>> b(4);
  for (int64_t id = 0; id < 230; ++id) b[id % 7 < 4 ? 0 : id % 7 < 6 ? 1 : 2].push_back(id);
  return b;  // sizes 132, 66, 32, 0
}

PlanOptions options(int64_t batch, Remainder r, uint64_t seed = 7) {
  PlanOptions o;
  o.global_batch = batch;
  o.remainder = r;
  o.seed = seed;
  return o;
}

class PlanRemainders : public ::testing::TestWithParam<Remainder> {};

TEST_P(PlanRemainders, EveryRankSeesTheSameStepsAndBucketsAndASliceOfOneBatch) {
  const auto buckets = example_buckets();
  for (int64_t epoch : {0, 1, 5}) {
    const EpochPlan plan(buckets, options(16, GetParam()), epoch);
    std::map<int64_t, int64_t> bucket_of_id;
    for (size_t k = 0; k < buckets.size(); ++k) {
      for (int64_t id : buckets[k]) bucket_of_id[id] = static_cast<int64_t>(k);
    }
    for (int world = 1; world <= 8; ++world) {
      // Each rank builds its own plan, as separate processes would.
      std::vector<EpochPlan> per_rank;
      for (int r = 0; r < world; ++r) per_rank.emplace_back(buckets, options(16, GetParam()), epoch);
      for (int r = 0; r < world; ++r) ASSERT_EQ(per_rank[r].steps(), plan.steps());
      for (int64_t s = 0; s < plan.steps(); ++s) {
        std::vector<int64_t> joined;
        std::set<int64_t> buckets_at_step;
        for (int r = 0; r < world; ++r) {
          const auto part = per_rank[r].rank_part(s, world, r);
          EXPECT_GE(part.size(), 16u / world);
          for (int64_t id : part) buckets_at_step.insert(bucket_of_id.at(id));
          joined.insert(joined.end(), part.begin(), part.end());
        }
        EXPECT_EQ(joined, plan.batch(s).samples) << "world " << world << " step " << s;
        EXPECT_EQ(buckets_at_step, std::set<int64_t>{plan.batch(s).bucket}) << "one resolution per step";
        EXPECT_EQ(std::set<int64_t>(joined.begin(), joined.end()).size(), joined.size())
            << "a sample twice in step " << s;
      }
    }
  }
}

TEST_P(PlanRemainders, CoverageFollowsThePolicy) {
  const auto buckets = example_buckets();
  const EpochPlan plan(buckets, options(16, GetParam()), 3);
  std::map<int64_t, int64_t> seen;
  for (int64_t s = 0; s < plan.steps(); ++s) {
    for (int64_t id : plan.batch(s).samples) ++seen[id];
  }
  // 132 = 8 x 16 + 4, 66 = 4 x 16 + 2, 32 = 2 x 16.
  if (GetParam() == Remainder::Drop) {
    EXPECT_EQ(plan.steps(), 8 + 4 + 2);
    EXPECT_EQ(seen.size(), 230u - 4 - 2);  // fewer than one batch per bucket left out
    for (const auto& [id, times] : seen) EXPECT_EQ(times, 1) << id;
  } else {
    EXPECT_EQ(plan.steps(), 9 + 5 + 2);
    EXPECT_EQ(seen.size(), 230u);  // everyone, a few twice (in different steps)
    int64_t repeats = 0;
    for (const auto& [id, times] : seen) repeats += times - 1;
    EXPECT_EQ(repeats, (16 - 4) + (16 - 2));
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, PlanRemainders, ::testing::Values(Remainder::Drop, Remainder::Pad),
                         [](const ::testing::TestParamInfo<Remainder>& info) { return remainder_name(info.param); });

TEST(Plan, IsAPureFunctionOfItsInputsWithAPinnedHash) {
  auto buckets = example_buckets();
  const EpochPlan a(buckets, options(16, Remainder::Drop), 2);
  for (auto& b : buckets) std::reverse(b.begin(), b.end());  // listing order does not matter
  const EpochPlan b(buckets, options(16, Remainder::Drop), 2);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a.hash(), EpochPlan(buckets, options(16, Remainder::Drop), 3).hash()) << "epochs differ";
  EXPECT_NE(a.hash(), EpochPlan(buckets, options(16, Remainder::Drop, 8), 2).hash()) << "seeds differ";
  // Pinned: a change here changes every run's data order; make it on purpose only.
  EXPECT_EQ(a.hash(), 0xbf7d1c4bc0145155ull) << std::hex << a.hash();
}

TEST(Plan, ResumeAtAnyStepAndOntoAnotherWorldSizeContinuesTheSameSequence) {
  const auto buckets = example_buckets();
  const EpochPlan original(buckets, options(24, Remainder::Pad), 4);
  // A run on 2 ranks stops after step 5; it resumes on 3 ranks from (epoch 4, step 5).
  std::vector<int64_t> before, after;
  for (int64_t s = 0; s < 5; ++s) {
    for (int r = 0; r < 2; ++r) {
      const auto part = original.rank_part(s, 2, r);
      before.insert(before.end(), part.begin(), part.end());
    }
  }
  const EpochPlan resumed(buckets, options(24, Remainder::Pad), 4);
  for (int64_t s = 5; s < resumed.steps(); ++s) {
    for (int r = 0; r < 3; ++r) {
      const auto part = resumed.rank_part(s, 3, r);
      after.insert(after.end(), part.begin(), part.end());
    }
  }
  std::vector<int64_t> whole;
  for (int64_t s = 0; s < original.steps(); ++s) {
    const auto b = original.batch(s).samples;
    whole.insert(whole.end(), b.begin(), b.end());
  }
  before.insert(before.end(), after.begin(), after.end());
  EXPECT_EQ(before, whole) << "a sample skipped or repeated across the resume";
}

// Each rank takes its part of each micro-batch: micro-batch j is the same samples on any number of
// ranks, and one process's part is the whole batch in order.
TEST(Plan, MicroBatchesAreSlicedForEachRank) {
  EXPECT_EQ(EpochPlan::rank_slots(8, 2, 2, 0), (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(EpochPlan::rank_slots(8, 2, 2, 1), (std::vector<int64_t>{2, 3, 6, 7}));
  EXPECT_EQ(EpochPlan::rank_slots(10, 2, 3, 0), (std::vector<int64_t>{0, 1, 5, 6}));
  EXPECT_EQ(EpochPlan::rank_slots(10, 2, 3, 2), (std::vector<int64_t>{4, 9}));
  EXPECT_EQ(EpochPlan::rank_micro_counts(10, 2, 3, 2), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(EpochPlan::rank_slots(6, 3, 1, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(EpochPlan::rank_slots(7, 1, 3, 1), (std::vector<int64_t>{3, 4}));  // no accumulation: as before
  PlanOptions o;
  o.global_batch = 8;
  o.micro_batches = 2;
  const EpochPlan plan({{10, 11, 12, 13, 14, 15, 16, 17}}, o, 0);
  const PlannedBatch all = plan.batch(0);
  EXPECT_EQ(plan.rank_part(0, 2, 1),
            (std::vector<int64_t>{all.samples[2], all.samples[3], all.samples[6], all.samples[7]}));
  for (const auto& [batch, micro, world] : {std::tuple{8, 3, 1}, std::tuple{8, 4, 3}}) {
    try {
      EpochPlan::rank_slots(batch, micro, world, 0);
      ADD_FAILURE() << batch << " " << micro << " " << world;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(micro == 3 ? "cannot be cut into 3 micro-batches"
                                                      : "a micro-batch of 2 cannot give each of 3 ranks"),
                std::string::npos)
          << e.what();
    }
  }
}

// train.shard_size: each rank's part of a micro-batch is whole shards, the first ranks holding one
// shard more; a shard size of 1 is the split above.
TEST(Plan, RanksHoldWholeShards) {
  EXPECT_EQ(EpochPlan::rank_slots(12, 1, 2, 0, 4), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(EpochPlan::rank_slots(12, 1, 2, 1, 4), (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_EQ(EpochPlan::rank_slots(16, 2, 3, 0, 2), (std::vector<int64_t>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(EpochPlan::rank_slots(16, 2, 3, 2, 2), (std::vector<int64_t>{6, 7, 14, 15}));
  EXPECT_EQ(EpochPlan::rank_offset(8, 3, 1, 2), 4);
  EXPECT_EQ(EpochPlan::rank_micro_counts(16, 2, 3, 1, 2), (std::vector<int64_t>{2, 2}));
  // Shards of 1: 24 images on 5 ranks are 5, 5, 5, 5 and 4, as without shards.
  EXPECT_EQ(EpochPlan::rank_slots(24, 1, 5, 3, 1), (std::vector<int64_t>{15, 16, 17, 18, 19}));
  EXPECT_EQ(EpochPlan::rank_slots(24, 1, 5, 4, 1), (std::vector<int64_t>{20, 21, 22, 23}));
  PlanOptions o;
  o.global_batch = 6;
  o.shard_size = 3;
  const EpochPlan plan({{10, 11, 12, 13, 14, 15}}, o, 0);
  const PlannedBatch all = plan.batch(0);
  EXPECT_EQ(plan.rank_part(0, 2, 1), (std::vector<int64_t>{all.samples[3], all.samples[4], all.samples[5]}));
  const std::string uncut = test_util::error_of<InvalidArgument>([] { EpochPlan::rank_slots(12, 2, 1, 0, 4); });
  EXPECT_NE(uncut.find("a micro-batch of 6 cannot be cut into shards of train.shard_size = 4"), std::string::npos)
      << uncut;
  const std::string few = test_util::error_of<InvalidArgument>([] { EpochPlan::rank_slots(12, 1, 4, 0, 4); });
  EXPECT_NE(few.find("a global batch of 12 in shards of 4 (3) cannot give each of 4 ranks a shard"), std::string::npos)
      << few;
}

TEST(Plan, ImpossibleBatchesAreClearErrorsBeforeTraining) {
  auto message = [](std::vector<std::vector<int64_t>> buckets, int64_t batch) {
    try {
      EpochPlan(std::move(buckets), options(batch, Remainder::Drop), 0);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({{1, 2, 3}, {4, 5, 6, 7, 8}}, 4).find("bucket 0 holds 3 samples, fewer than one global batch of 4"),
            std::string::npos);
  EXPECT_NE(message({{}, {}}, 4).find("no bucket holds a global batch of 4"), std::string::npos);
  EXPECT_NE(message({}, 4).find("no bucket holds"), std::string::npos);
  const EpochPlan plan({{1, 2, 3, 4}}, options(4, Remainder::Drop), 0);
  EXPECT_THROW(plan.rank_part(0, 5, 0), InvalidArgument);  // 4 samples cannot feed 5 ranks
  EXPECT_THROW(plan.batch(1), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::data
