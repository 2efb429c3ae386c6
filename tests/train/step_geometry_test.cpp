#include "lockstep/train/step_geometry.h"

#include <gtest/gtest.h>

#include <string>

#include "error_of.h"
#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {

using test_util::error_of;

TEST(StepGeometry, CountsARanksSamplesAndShardsOfAStep) {
  const StepGeometry whole{24, 2, 0};  // two micro-batches of 12, no shards
  EXPECT_EQ(whole.micro_batch(), 12);
  EXPECT_FALSE(whole.sharded());
  EXPECT_EQ(whole.unit(), 1);
  EXPECT_EQ(whole.most_per_rank(5), 3);  // 12 over 5 ranks: 3, 3, 2, 2, 2
  EXPECT_EQ(whole.most_per_rank(1), 12);

  const StepGeometry shards{24, 2, 4};  // micro-batches of 12: 3 shards of 4 each
  EXPECT_TRUE(shards.sharded());
  EXPECT_EQ(shards.unit(), 4);
  EXPECT_EQ(shards.shards_per_rank(2), 4);  // 2 shards a micro-batch on the first rank, twice
  EXPECT_EQ(shards.shards_per_rank(3), 2);
  EXPECT_EQ(shards.shards_per_rank(1), 6);
}

TEST(StepGeometry, RefusesMicroBatchesAndShardsThatDoNotDivide) {
  EXPECT_NE(error_of<InvalidArgument>([] {
              StepGeometry{10, 4, 0}.check();
            }).find("train.grad_accum = 4 must divide train.batch_size = 10"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] {
              StepGeometry{24, 2, 5}.check();
            }).find("train.shard_size = 5 must divide the micro-batch of 12 (ranks hold whole shards)"),
            std::string::npos);
  EXPECT_NE(error_of<InvalidArgument>([] {
              StepGeometry{10, 1, 4}.check();
            }).find("train.shard_size = 4 must divide the global batch of 10"),
            std::string::npos);
  EXPECT_NO_THROW((StepGeometry{24, 2, 4}.check()));
  EXPECT_NO_THROW((StepGeometry{24, 3, 0}.check()));
}

TEST(StepGeometry, RefusesFewerSamplesOrShardsThanRanks) {
  const std::string few = error_of<InvalidArgument>([] { StepGeometry{8, 4, 0}.check_ranks(3); });
  EXPECT_NE(few.find("train.batch_size = 8 is the global batch, cut into 4 micro-batches of 2: it needs at least one "
                     "image for each of the 3 ranks in each micro-batch"),
            std::string::npos)
      << few;
  const std::string shards = error_of<InvalidArgument>([] { StepGeometry{16, 2, 4}.check_ranks(3); });
  EXPECT_NE(shards.find("train.batch_size = 16 in micro-batches of 8 holds 2 shards of train.shard_size = 4 each: it "
                        "needs at least one for each of the 3 ranks"),
            std::string::npos)
      << shards;
  EXPECT_NO_THROW((StepGeometry{16, 2, 4}.check_ranks(2)));
  EXPECT_NO_THROW((StepGeometry{6, 1, 0}.check_ranks(6)));
}

}  // namespace
}  // namespace lockstep::train
