// Predicted checks (issue #51, docs/distributed.md): once the calls repeat, each rank checks its call
// against the prediction locally, with no exchange; a rank that departs from it is named on every rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "dist/checked_group.h"
#include "lockstep/dist/collective.h"
#include "rank_threads.h"

namespace lockstep::dist {
namespace {

using test_util::Join;
using test_util::message_of;
using test_util::run_ranks;

constexpr int kRepeats = 12;  // the calls repeat long enough to be predicted (predictor.h)

// One step of a training loop: two gradient buckets and a codebook statistic.
void step(Group& g, int r, int64_t rows = 4) {
  std::vector<at::Tensor> bucket{torch::full({6}, static_cast<float>(r + 1))};
  g.all_reduce(bucket, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.bucket"));
  EXPECT_TRUE(torch::equal(bucket[0], torch::full({6}, 3.0f)));
  auto pending = g.all_reduce_async(bucket, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.bucket"));
  pending->wait();
  EXPECT_TRUE(torch::equal(bucket[0], torch::full({6}, 6.0f)));
  const auto counts = g.all_gather(torch::full({rows}, static_cast<float>(r)), LOCKSTEP_CALL_SITE("test.counts"));
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_TRUE(torch::equal(counts[1], torch::full({rows}, 1.0f)));
}

// A predicted check passes without the other rank: rank 1 reaches its last check only after rank 0's
// passed. With an exchange, rank 0's would wait for rank 1's and the test would end at ctest's limit.
TEST(PredictedChecks, ARepeatedCheckPassesWithoutWaitingForTheOtherRanks) {
  for (const Join join : {Join::InMemory, Join::Gloo}) {
    std::promise<void> rank0_passed;
    std::shared_future<void> passed = rank0_passed.get_future().share();
    std::vector<std::promise<std::string>> last(2);
    const auto errors = run_ranks(
        2,
        [&](Group& g, int r) {
          auto& checked = dynamic_cast<CheckedGroup&>(g);
          const at::Tensor t = torch::zeros({3});
          for (int i = 0; i < kRepeats; ++i) {
            if (i == kRepeats - 1 && r == 1) passed.wait();
            checked.check_foreign_then_watched(
                "all_reduce(sum)", {t}, "test.check", "a.py", 1, false,
                [&, i, r](std::exception_ptr error, std::shared_ptr<const CollectiveCall> predicted) {
                  if (i < kRepeats - 1) return;
                  last[static_cast<size_t>(r)].set_value(error       ? message_of<std::exception>(error)
                                                         : predicted ? "predicted"
                                                                     : "exchanged");
                  if (r == 0) rank0_passed.set_value();
                });
          }
          EXPECT_EQ(last[static_cast<size_t>(r)].get_future().get(), "predicted");
        },
        join);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_FALSE(errors[r]) << test_util::join_name(join) << " rank " << r << ": "
                              << message_of<std::exception>(errors[r]);
    }
  }
}

// Rank 1 departs from the repeated calls (another shape) while rank 0 follows them: rank 0 issued the
// predicted collective, which can never complete. Both name both calls, far below the timeout, and
// the group refuses what comes next instead of pairing it with the pending collective.
TEST(PredictedChecks, ARankThatDepartsIsNamedOnEveryRankAndTheGroupIsUnusable) {
  for (const Join join : {Join::InMemory, Join::Gloo}) {
    std::vector<std::string> seen(2), after(2);
    std::vector<double> seconds(2, 0.0);
    const auto errors = run_ranks(
        2,
        [&](Group& g, int r) {
          for (int i = 0; i < kRepeats; ++i) step(g, r);
          const auto start = std::chrono::steady_clock::now();
          try {
            step(g, r, r == 1 ? 5 : 4);  // rank 1's all_gather departs
          } catch (const CollectiveMismatch& e) {
            seen[static_cast<size_t>(r)] = e.what();
          }
          seconds[static_cast<size_t>(r)] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          try {
            g.barrier(LOCKSTEP_CALL_SITE("test.after"));
          } catch (const CollectiveFailure& e) {
            after[static_cast<size_t>(r)] = e.what();
          }
        },
        join);
    for (size_t r = 0; r < 2; ++r) {
      const std::string name = std::string(test_util::join_name(join)) + " rank " + std::to_string(r);
      EXPECT_FALSE(errors[r]) << name << ": " << message_of<std::exception>(errors[r]);
      EXPECT_NE(seen[r].find("all_gather of [float32 (4)] at test.counts"), std::string::npos) << name << seen[r];
      EXPECT_NE(seen[r].find("all_gather of [float32 (5)] at test.counts"), std::string::npos) << name << seen[r];
      EXPECT_NE(seen[r].find("this group is unusable"), std::string::npos) << name << seen[r];
      EXPECT_LT(seconds[r], test_util::kFarBelowTheTimeoutS) << name;
      EXPECT_NE(after[r].find("refused"), std::string::npos) << name << after[r];
    }
  }
}

// Every rank departs the same way (an evaluation after the repeated steps): nothing was issued on the
// prediction, the exchange agrees, the sums are right, and the steps after it are predicted again.
TEST(PredictedChecks, EveryRankDepartingTheSameWayGoesOn) {
  for (const Join join : {Join::InMemory, Join::Gloo}) {
    const auto errors = run_ranks(
        2,
        [&](Group& g, int r) {
          for (int i = 0; i < kRepeats; ++i) step(g, r);
          std::vector<at::Tensor> loss{torch::full({1}, static_cast<float>(r + 1))};
          g.all_reduce(loss, ReduceOp::Max, LOCKSTEP_CALL_SITE("test.evaluation"));
          EXPECT_TRUE(torch::equal(loss[0], torch::full({1}, 2.0f)));
          for (int i = 0; i < kRepeats; ++i) step(g, r);
        },
        join);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_FALSE(errors[r]) << test_util::join_name(join) << " rank " << r << ": "
                              << message_of<std::exception>(errors[r]);
    }
  }
}

// What every rank's checks passed as: the repeated ones on the prediction, the call every rank departs to
// by the exchange (with no error), and the repeated ones after it on the prediction again.
TEST(PredictedChecks, AfterEveryRankDepartedAlikeTheExchangeDecidesAndPredictionsResume) {
  std::vector<std::vector<std::string>> outcomes(2);
  const auto errors = run_ranks(
      2,
      [&](Group& g, int r) {
        auto& checked = dynamic_cast<CheckedGroup&>(g);
        const at::Tensor t = torch::zeros({3});
        // One check at a time, as a training loop's calls come (checks queued together are agreed on
        // in one exchange, before any prediction).
        for (int i = 0; i < 2 * kRepeats + 1; ++i) {
          std::promise<std::string> seen;
          checked.check_foreign_then_watched(
              i == kRepeats ? "broadcast(root 0)" : "all_reduce(sum)", {t}, "test.check", "a.py", 1, false,
              [&seen](std::exception_ptr error, std::shared_ptr<const CollectiveCall> predicted) {
                seen.set_value(error ? message_of<std::exception>(error) : predicted ? "predicted" : "exchanged");
              });
          const std::string outcome = seen.get_future().get();
          if (i == kRepeats - 1 || i == kRepeats || i == 2 * kRepeats)
            outcomes[static_cast<size_t>(r)].push_back(outcome);
        }
      },
      Join::InMemory);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_FALSE(errors[r]) << "rank " << r << ": " << message_of<std::exception>(errors[r]);
    EXPECT_EQ(outcomes[r], (std::vector<std::string>{"predicted", "exchanged", "predicted"})) << "rank " << r;
  }
}

// Ranks that depart in different ways: nobody issued anything, so the exchange names both calls and
// the group still works, as without a prediction.
TEST(PredictedChecks, RanksDepartingInDifferentWaysAreAMismatchAndTheGroupStillWorks) {
  for (const Join join : {Join::InMemory, Join::Gloo}) {
    std::vector<std::string> seen(2);
    const auto errors = run_ranks(
        2,
        [&](Group& g, int r) {
          for (int i = 0; i < kRepeats; ++i) step(g, r);
          try {
            step(g, r, r == 0 ? 7 : 8);
          } catch (const CollectiveMismatch& e) {
            seen[static_cast<size_t>(r)] = e.what();
          }
          EXPECT_TRUE(test_util::group_still_sums(g));
        },
        join);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_FALSE(errors[r]) << test_util::join_name(join) << " rank " << r << ": "
                              << message_of<std::exception>(errors[r]);
      EXPECT_NE(seen[r].find("[float32 (7)]"), std::string::npos) << seen[r];
      EXPECT_NE(seen[r].find("[float32 (8)]"), std::string::npos) << seen[r];
      EXPECT_NE(seen[r].find("so none of them ran it"), std::string::npos) << seen[r];
    }
  }
}

}  // namespace
}  // namespace lockstep::dist
