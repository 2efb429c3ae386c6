#include "dist/in_order.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/checked_group.h"
#include "lockstep/dist/collective.h"
#include "rank_threads.h"

namespace lockstep::dist {
namespace {

using test_util::Join;
using test_util::message_of;
using test_util::run_ranks;

// Posted tasks run on the worker in order, and a run() submitted after them waits for all of them.
TEST(InOrder, ARunAfterPostedTasksRunsAfterThemOnTheCallersThread) {
  InOrder order;
  std::vector<int> ran;  // written by one task at a time: the turns exclude each other
  std::thread::id worker;
  for (int i = 0; i < 50; ++i) {
    order.post([&, i] {
      if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the later ones queue up
      worker = std::this_thread::get_id();
      ran.push_back(i);
    });
  }
  order.run([&] { ran.push_back(50); });
  ASSERT_EQ(ran.size(), 51u);
  for (int i = 0; i <= 50; ++i) EXPECT_EQ(ran[static_cast<size_t>(i)], i);
  EXPECT_NE(worker, std::this_thread::get_id());
}

// post() returns while its task is still waiting: nothing the caller does after it is held up.
TEST(InOrder, PostReturnsBeforeItsTaskRuns) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> second_ran{false};
  {
    InOrder order;
    order.post([released] { released.wait(); });
    order.post([&] { second_ran = true; });
    EXPECT_FALSE(second_ran.load());
    release.set_value();
  }  // the destructor runs what was posted before it joins the worker
  EXPECT_TRUE(second_ran.load());
}

// A task that throws reaches its caller and passes the turn on: the next submission still runs.
TEST(InOrder, AThrowingRunPassesTheTurnOn) {
  InOrder order;
  EXPECT_THROW(order.run([] { throw std::runtime_error("the task failed"); }), std::runtime_error);
  bool posted_ran = false;
  order.post([&] { posted_ran = true; });
  int after = 0;
  order.run([&] { after = 1; });
  EXPECT_TRUE(posted_ran);
  EXPECT_EQ(after, 1);
}

// A caller that waits for a posted turn runs the turns that have come itself when the worker has not
// taken them: whoever runs them, they run once each, in order, and the wait ends once its turn ran.
TEST(InOrder, WaitingForATurnRunsEveryEarlierTurnOnceInOrder) {
  InOrder order;
  std::vector<int> ran;
  std::set<std::thread::id> threads;
  uint64_t last = 0;
  for (int i = 0; i < 200; ++i) {
    last = order.post([&, i] {
      ran.push_back(i);
      threads.insert(std::this_thread::get_id());
    });
    if (i % 50 == 49) {
      order.wait_for_turn(last);
      ASSERT_EQ(ran.size(), static_cast<size_t>(i + 1));
    }
  }
  for (int i = 0; i < 200; ++i) EXPECT_EQ(ran[static_cast<size_t>(i)], i);
  EXPECT_LE(threads.size(), 2u);  // the worker's and this one's
}

// Callers on several threads each get their own turn: no two tasks overlap.
// run_if_idle runs at once on the caller's thread only when nothing is queued or running; a task that
// declines (false) still passes its turn on, and a declined or refused caller submits as usual.
TEST(InOrder, RunIfIdleRunsOnlyWhenNothingIsQueued) {
  InOrder order;
  std::thread::id ran_on;
  const auto turn = order.run_if_idle([&] {
    ran_on = std::this_thread::get_id();
    return true;
  });
  ASSERT_TRUE(turn.has_value());
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  order.wait_for_turn(*turn);  // already run: returns at once

  EXPECT_FALSE(order.run_if_idle([] { return false; }).has_value());

  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  order.post([released] { released.wait(); });
  bool ran_while_busy = false;
  EXPECT_FALSE(order.run_if_idle([&] { return ran_while_busy = true; }).has_value());
  EXPECT_FALSE(ran_while_busy);
  release.set_value();
  int after = 0;
  order.run([&] { after = 1; });  // the declined turn and the posted one passed on
  EXPECT_EQ(after, 1);
}

TEST(InOrder, TasksFromManyThreadsNeverOverlap) {
  InOrder order;
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  int count = 0;
  auto task = [&] {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    ++count;
    inside.fetch_sub(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        if (t % 2 == 0) {
          order.run(task);
        } else {
          order.post(task);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  order.run([] {});
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(count, 800);
}

// lockstep.distributed's path: a check that returns before the other rank has even reached it, whose
// `then` runs once both agreed, before the group's next collective; a disagreement reaches `then` as
// CollectiveMismatch on both ranks, after which the group works on (every rank stopped at the same call).
TEST(ForeignCollectives, ACheckThenReturnsBeforeTheCheckAndRunsInTurn) {
  for (const Join join : {Join::InMemory, Join::Gloo}) {
    std::promise<void> rank0_returned;
    std::shared_future<void> returned = rank0_returned.get_future().share();
    std::vector<std::string> seen(2);
    const auto errors = run_ranks(
        2,
        [&](Group& g, int r) {
          auto& checked = dynamic_cast<CheckedGroup&>(g);
          std::promise<std::string> agreed, disagreed;
          std::vector<std::string> order;
          const at::Tensor t = torch::zeros({3});
          // Rank 1 reaches the check only after rank 0's call returned: a call that waited for the
          // agreement would never return (the test would end at ctest's limit).
          if (r == 1) returned.wait();
          checked.check_foreign_then("all_reduce(sum)", {t}, "test.first", "a.py", 1, false,
                                     [&](std::exception_ptr error) {
                                       order.push_back("first");
                                       agreed.set_value(message_of<CollectiveMismatch>(error));
                                     });
          if (r == 0) rank0_returned.set_value();
          checked.check_foreign_then(r == 0 ? "all_reduce(sum)" : "broadcast(root 0)", {t}, "test.second", "a.py", 2,
                                     false, [&](std::exception_ptr error) {
                                       order.push_back("second");
                                       disagreed.set_value(message_of<CollectiveMismatch>(error));
                                     });
          EXPECT_EQ(agreed.get_future().get(), "(no error)");
          seen[static_cast<size_t>(r)] = disagreed.get_future().get();
          EXPECT_EQ(order, (std::vector<std::string>{"first", "second"}));
          // Every rank stopped at the same collective: the group goes on working.
          EXPECT_TRUE(test_util::group_still_sums(g));
        },
        join);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_FALSE(errors[r]) << test_util::join_name(join) << " rank " << r << ": "
                              << message_of<std::exception>(errors[r]);
      EXPECT_NE(seen[r].find("#2 all_reduce(sum) of [float32 (3)] at test.second"), std::string::npos) << seen[r];
      EXPECT_NE(seen[r].find("#2 broadcast(root 0) of [float32 (3)] at test.second"), std::string::npos) << seen[r];
    }
  }
}

// A synchronous collective submitted after a posted check runs after it: the check's `then` (which
// issues the checked collective) comes first on every rank, and the sum is right.
TEST(ForeignCollectives, ASynchronousCollectiveWaitsForTheChecksPostedBeforeIt) {
  const auto errors = run_ranks(
      2,
      [&](Group& g, int r) {
        auto& checked = dynamic_cast<CheckedGroup&>(g);
        std::atomic<int> then_ran{0};
        for (int i = 0; i < 5; ++i) {
          checked.check_foreign_then("barrier", {}, "test.check", "a.py", i, false, [&](std::exception_ptr error) {
            EXPECT_FALSE(error) << message_of<std::exception>(error);
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            then_ran.fetch_add(1);
          });
        }
        std::vector<at::Tensor> own{torch::full({2}, static_cast<float>(r + 1))};
        g.all_reduce(own, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.after"));
        EXPECT_EQ(then_ran.load(), 5);
        EXPECT_TRUE(torch::equal(own[0], torch::full({2}, 3.0f)));
      },
      Join::InMemory);
  for (size_t r = 0; r < 2; ++r) EXPECT_FALSE(errors[r]) << message_of<std::exception>(errors[r]);
}

// Checks queued on one rank while the others post them one at a time: windows of different lengths
// meet, every rank acts on what all of them have, and a disagreement inside a window is named at its
// own place (#3) while the checks around it pass, in order. At 2 ranks every rank judges the gathered
// fingerprints; at 6 rank 0 judges them and the others act on its verdict.
TEST(ForeignCollectives, WindowsOfDifferentLengthsAgreeOnWhatEveryRankHas) {
  for (const int size : {2, 6}) {
    for (const Join join : {Join::InMemory, Join::Gloo}) {
      // What the `then`s touch outlives the ranks' threads: the last one may still be returning from
      // set_value() when its rank's thread wakes (the group, joined after, runs nothing more).
      struct Outcome {
        std::vector<std::string> seen;  // written in the group's turns only, read after it joined
        std::promise<void> all_ran;
      };
      std::vector<Outcome> outcomes(static_cast<size_t>(size));
      const auto errors = run_ranks(
          size,
          [&](Group& g, int r) {
            auto& checked = dynamic_cast<CheckedGroup&>(g);
            Outcome& outcome = outcomes[static_cast<size_t>(r)];
            const std::vector<std::string> ops = {"a", "b", r == size - 1 ? "x" : "c", "d", "e", "f"};
            for (size_t i = 0; i < ops.size(); ++i) {
              if (r > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // rank 0's queue fills up
              checked.check_foreign_then(
                  ops[i], {}, "test.window", "a.py", static_cast<int>(i), false,
                  [&outcome, ops, i](std::exception_ptr error) {
                    outcome.seen.push_back(error ? message_of<CollectiveMismatch>(error) : ops[i]);
                    if (outcome.seen.size() == ops.size()) outcome.all_ran.set_value();
                  });
            }
            outcome.all_ran.get_future().wait();
          },
          join);
      for (size_t r = 0; r < outcomes.size(); ++r) {
        const std::string where =
            std::to_string(size) + " ranks, " + test_util::join_name(join) + ", rank " + std::to_string(r);
        EXPECT_FALSE(errors[r]) << where << ": " << message_of<std::exception>(errors[r]);
        const std::vector<std::string>& seen = outcomes[r].seen;
        ASSERT_EQ(seen.size(), 6u) << where;
        EXPECT_EQ(seen[0], "a") << where;
        EXPECT_EQ(seen[1], "b") << where;
        EXPECT_NE(seen[2].find("#3 c at test.window"), std::string::npos) << where << ": " << seen[2];
        EXPECT_NE(seen[2].find("#3 x at test.window"), std::string::npos) << where << ": " << seen[2];
        EXPECT_EQ(seen[3], "d") << where;
        EXPECT_EQ(seen[5], "f") << where;
      }
    }
  }
}

}  // namespace
}  // namespace lockstep::dist
