#include "lockstep/dist/group.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::dist {
namespace {

TEST(SingleProcessGroup, IsRankZeroOfOne) {
  auto g = make_single_process_group();
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
}

TEST(SingleProcessGroup, CollectivesAreIdentities) {
  auto g = make_single_process_group();
  std::vector<at::Tensor> ts = {torch::tensor({1.5f, -2.0f}), torch::tensor({int64_t{7}})};
  const auto before = std::vector<at::Tensor>{ts[0].clone(), ts[1].clone()};
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    g->all_reduce(ts, op, LOCKSTEP_CALL_SITE("test"));
    EXPECT_TRUE(torch::equal(ts[0], before[0]));
    EXPECT_TRUE(torch::equal(ts[1], before[1]));
  }
  g->broadcast(ts, 0, LOCKSTEP_CALL_SITE("test"));
  EXPECT_TRUE(torch::equal(ts[0], before[0]));
  const auto gathered = g->all_gather(ts[0], LOCKSTEP_CALL_SITE("test"));
  ASSERT_EQ(gathered.size(), 1u);
  EXPECT_TRUE(torch::equal(gathered[0], before[0]));
  // The gathered tensor is a copy: changing it must not change the input.
  gathered[0].add_(1);
  EXPECT_TRUE(torch::equal(ts[0], before[0]));
  g->barrier(LOCKSTEP_CALL_SITE("test"));
}

TEST(SingleProcessGroup, RejectsWhatWouldBeWrongOnManyRanks) {
  auto g = make_single_process_group();
  std::vector<at::Tensor> ts = {torch::ones({2})};
  try {
    g->broadcast(ts, 1, LOCKSTEP_CALL_SITE("weights"));
    FAIL() << "broadcast from rank 1 of a group of 1 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("weights (" __FILE__), std::string::npos) << e.what();
  }
  std::vector<at::Tensor> undefined = {at::Tensor()};
  EXPECT_THROW(g->all_reduce(undefined, ReduceOp::Sum, LOCKSTEP_CALL_SITE("x")), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::dist
