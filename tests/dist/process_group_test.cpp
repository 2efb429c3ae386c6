#include "lockstep/dist/process_group.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "lockstep/dist/collective.h"
#include "lockstep/dist/group_reducer.h"
#include "lockstep/quant/lfq.h"
#include "rank_threads.h"

namespace lockstep::dist {
namespace {

using test_util::message_of;
using test_util::run_ranks;

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_FALSE(errors[r]) << "rank " << r << ": " << message_of<std::exception>(errors[r]);
  }
}

using test_util::Join;

class ProcessGroupRanks : public ::testing::TestWithParam<std::tuple<int, Join>> {};

TEST_P(ProcessGroupRanks, CollectivesGiveTheirDefinitionsWithMixedDtypesInOneCall) {
  const auto [w, join] = GetParam();
  expect_no_errors(run_ranks(
      w,
      [w = w](Group& g, int r) {
        ASSERT_EQ(g.rank(), r);
        ASSERT_EQ(g.size(), w);
        // One call, two dtypes and shapes: values r+1 everywhere.
        std::vector<at::Tensor> t{torch::full({3}, r + 1.0f), torch::full({2, 2}, int64_t{r + 1}, torch::kInt64)};
        g.all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.sum"));
        EXPECT_TRUE(torch::equal(t[0], torch::full({3}, w * (w + 1) / 2.0f)));
        EXPECT_TRUE(torch::equal(t[1], torch::full({2, 2}, int64_t{w * (w + 1) / 2}, torch::kInt64)));
        std::vector<at::Tensor> m{torch::tensor({float(r), float(-r)})};
        g.all_reduce(m, ReduceOp::Max, LOCKSTEP_CALL_SITE("test.max"));
        EXPECT_TRUE(torch::equal(m[0], torch::tensor({float(w - 1), 0.0f})));
        std::vector<at::Tensor> n{torch::tensor({float(r)})};
        g.all_reduce(n, ReduceOp::Min, LOCKSTEP_CALL_SITE("test.min"));
        EXPECT_EQ(n[0].item<float>(), 0.0f);
        const auto gathered = g.all_gather(torch::full({2}, r * 10.0f), LOCKSTEP_CALL_SITE("test.gather"));
        ASSERT_EQ(static_cast<int>(gathered.size()), w);
        for (int k = 0; k < w; ++k) EXPECT_TRUE(torch::equal(gathered[k], torch::full({2}, k * 10.0f)));
        std::vector<at::Tensor> b{torch::full({4}, float(r)), torch::full({1}, int64_t{r}, torch::kInt64)};
        g.broadcast(b, w - 1, LOCKSTEP_CALL_SITE("test.broadcast"));
        EXPECT_TRUE(torch::equal(b[0], torch::full({4}, float(w - 1))));
        EXPECT_EQ(b[1].item<int64_t>(), w - 1);
        g.barrier(LOCKSTEP_CALL_SITE("test.barrier"));
        // Several all_reduces in flight at once (gradient buckets) complete in issue order.
        std::vector<std::vector<at::Tensor>> buckets;
        for (int b = 0; b < 3; ++b) buckets.push_back({torch::full({5}, float(b * (r + 1)))});
        std::vector<std::unique_ptr<PendingCollective>> pending;
        for (auto& bucket : buckets)
          pending.push_back(g.all_reduce_async(bucket, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.bucket")));
        for (auto& p : pending) p->wait();
        for (int b = 0; b < 3; ++b)
          EXPECT_TRUE(torch::equal(buckets[b][0], torch::full({5}, float(b * w * (w + 1) / 2))));
      },
      join));
}

INSTANTIATE_TEST_SUITE_P(Sizes, ProcessGroupRanks,
                         ::testing::Combine(::testing::Values(1, 2, 3, 6),
                                            ::testing::Values(Join::Gloo, Join::InMemory)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "Ranks" +
                                  test_util::join_name(std::get<1>(info.param));
                         });

struct Mismatch {
  std::string name;
  std::function<void(Group&, int)> call;  // rank 0 and rank 1 disagree
  std::vector<std::string> rank0, rank1;  // fragments each rank's description must show
};

void PrintTo(const Mismatch& m, std::ostream* os) { *os << m.name; }

std::vector<Mismatch> mismatches() {
  return {
      {"shape",
       [](Group& g, int r) {
         std::vector<at::Tensor> t{torch::ones({r == 0 ? 1000000 : 2000000})};
         g.all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE(r == 0 ? "grad.bucket0" : "vq.ema"));
       },
       {"float32 (1000000)", "grad.bucket0"},
       {"float32 (2000000)", "vq.ema"}},
      {"dtype",
       [](Group& g, int r) {
         std::vector<at::Tensor> t{torch::ones({4}, r == 0 ? torch::kFloat32 : torch::kFloat64)};
         g.all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("stats"));
       },
       {"float32 (4)"},
       {"float64 (4)"}},
      {"op",
       [](Group& g, int r) {
         std::vector<at::Tensor> t{torch::ones({4})};
         if (r == 0)
           g.all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("params"));
         else
           g.broadcast(t, 0, LOCKSTEP_CALL_SITE("params"));
       },
       {"all_reduce(sum)"},
       {"broadcast(root 0)"}},
      {"reduce_op",
       [](Group& g, int r) {
         std::vector<at::Tensor> t{torch::ones({4})};
         g.all_reduce(t, r == 0 ? ReduceOp::Sum : ReduceOp::Max, LOCKSTEP_CALL_SITE("loss"));
       },
       {"all_reduce(sum)"},
       {"all_reduce(max)"}},
      {"root",
       [](Group& g, int r) {
         std::vector<at::Tensor> t{torch::ones({4})};
         g.broadcast(t, r, LOCKSTEP_CALL_SITE("params.init"));
       },
       {"broadcast(root 0)"},
       {"broadcast(root 1)"}},
      {"skipped",
       [](Group& g, int r) {
         std::vector<at::Tensor> t{torch::ones({4})};
         if (r == 0) g.all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("eval.only_rank0"));
         g.barrier(LOCKSTEP_CALL_SITE("epoch.end"));
       },
       {"#2 all_reduce(sum)", "eval.only_rank0"},
       {"#2 barrier", "epoch.end"}},
      {"call_site",
       [](Group& g, int r) {
         std::vector<at::Tensor> t{torch::ones({4})};
         g.all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE(r == 0 ? "eval.mse" : "grad.bucket3"));
       },
       {"eval.mse"},
       {"grad.bucket3"}},
      // torch.distributed's collectives checked through lockstep.distributed (check_foreign_collective).
      {"foreign_op",
       [](Group& g, int r) {
         check_foreign_collective(g, r == 0 ? "all_reduce(avg)" : "all_reduce(sum)", {torch::ones({4})},
                                  LOCKSTEP_CALL_SITE("dist.all_reduce in step"), false);
       },
       {"#2 all_reduce(avg) of [float32 (4)] at dist.all_reduce in step"},
       {"#2 all_reduce(sum) of [float32 (4)]"}},
      {"foreign_against_own",
       [](Group& g, int r) {
         std::vector<at::Tensor> t{torch::ones({4})};
         if (r == 0)
           check_foreign_collective(g, "all_reduce(sum)", t, LOCKSTEP_CALL_SITE("dist.all_reduce in log"), false);
         else
           g.all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("vq.ema"));
       },
       {"#2 all_reduce(sum) of [float32 (4)] at dist.all_reduce in log"},
       {"#2 all_reduce(sum) of [float32 (4)] at vq.ema"}},
      {"foreign_barrier_skipped",
       [](Group& g, int r) {
         if (r == 0) check_foreign_collective(g, "barrier", {}, LOCKSTEP_CALL_SITE("dist.barrier in save"), false);
         check_foreign_collective(g, "all_reduce(sum)", {torch::ones({1})}, LOCKSTEP_CALL_SITE("dist.all_reduce"),
                                  false);
       },
       {"#2 barrier at dist.barrier in save"},
       {"#2 all_reduce(sum) of [float32 (1)]"}},
  };
}

class CollectiveMismatches : public ::testing::TestWithParam<std::tuple<Mismatch, Join>> {};

TEST_P(CollectiveMismatches, RaiseOnEveryRankBeforeTheTimeoutNamingBothCallsThenTheGroupStillWorks) {
  const Mismatch& m = std::get<0>(GetParam());
  std::vector<double> seconds(2);
  const auto errors = run_ranks(
      2,
      [&](Group& g, int r) {
        g.barrier(LOCKSTEP_CALL_SITE("test.start"));
        const auto start = std::chrono::steady_clock::now();
        try {
          m.call(g, r);
          ADD_FAILURE() << "rank " << r << " saw no mismatch";
        } catch (const CollectiveMismatch& e) {
          seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          ASSERT_EQ(e.per_rank().size(), 2u);
          for (const auto& part : m.rank0) EXPECT_NE(e.per_rank()[0].find(part), std::string::npos) << e.what();
          for (const auto& part : m.rank1) EXPECT_NE(e.per_rank()[1].find(part), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("seen by rank " + std::to_string(r)), std::string::npos) << e.what();
        }
        // Nothing ran, so the group is still usable.
        EXPECT_TRUE(test_util::group_still_sums(g));
      },
      std::get<1>(GetParam()));
  expect_no_errors(errors);
  // Well inside the 20 s timeout, so raised by the check, not a timeout; bench/ measures the speed.
  for (int r = 0; r < 2; ++r) EXPECT_LT(seconds[r], test_util::kFarBelowTheTimeoutS) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Kinds, CollectiveMismatches,
                         ::testing::Combine(::testing::ValuesIn(mismatches()),
                                            ::testing::Values(Join::Gloo, Join::InMemory)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + test_util::join_name(std::get<1>(info.param));
                         });

// A foreign check moves no data and takes one sequence number; unless asked, ranks may reach it from
// different call sites (each reported, neither compared).
TEST(ForeignCollectives, AgreeingChecksMoveNothingAndIgnoreTheSiteUnlessAsked) {
  const auto errors = run_ranks(
      2,
      [&](Group& g, int r) {
        at::Tensor t = torch::full({3}, static_cast<float>(r));
        check_foreign_collective(g, "all_reduce(sum)", {t}, LOCKSTEP_CALL_SITE(r == 0 ? "a" : "b"), false);
        EXPECT_TRUE(torch::equal(t, torch::full({3}, static_cast<float>(r))));
        try {
          check_foreign_collective(g, "barrier", {}, LOCKSTEP_CALL_SITE(r == 0 ? "a" : "b"), true);
          ADD_FAILURE() << "rank " << r << ": call sites compared, yet no mismatch";
        } catch (const CollectiveMismatch& e) {
          EXPECT_NE(e.per_rank()[0].find("#2 barrier at a"), std::string::npos) << e.what();
          EXPECT_NE(e.per_rank()[1].find("#2 barrier at b"), std::string::npos) << e.what();
        }
        EXPECT_TRUE(test_util::group_still_sums(g));
      },
      Join::InMemory);
  expect_no_errors(errors);
  // A group of one process has nobody to disagree with.
  SingleProcessGroup one;
  check_foreign_collective(one, "barrier", {}, LOCKSTEP_CALL_SITE("alone"), true);
}

// Without fingerprints (checked = false, for measuring the check's cost) nothing stops ranks from
// disagreeing; the in-memory transport still turns it into an error on every rank, as Gloo would
// not always (it can abort the process or return a wrong sum).
TEST(InMemoryGroups, UncheckedCallsThatDisagreeFailOnEveryRank) {
  GroupOptions o = test_util::local_options(0, 2, 0);
  o.checked = false;
  const auto groups = make_in_memory_groups(o);
  std::vector<std::string> messages(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<at::Tensor> t{torch::ones({r + 1})};
      try {
        groups[r]->all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.unchecked"));
      } catch (const CollectiveFailure& e) {
        messages[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(messages[r].find("#1 all_reduce(sum) of [float32 (" + std::to_string(r + 1) + ")] at test.unchecked"),
              std::string::npos)
        << messages[r];
    EXPECT_NE(messages[r].find("differs between ranks"), std::string::npos) << messages[r];
  }
  EXPECT_EQ(groups[1]->describe(), "in-memory, rank 1 of 2");
}

// A call whose tensors no transport of the group carries (here the meta device; on a group without
// NCCL, CUDA tensors) or that mixes devices is refused before it takes a sequence number, so the
// group goes on as if it had not been made.
TEST(InMemoryGroups, TensorsOnDevicesNoTransportCarriesAreRefusedBeforeAnythingMoves) {
  const auto groups = make_in_memory_groups(test_util::local_options(0, 1, 0));
  Group& g = *groups[0];
  std::vector<at::Tensor> meta{torch::empty({3}, torch::TensorOptions().device(torch::kMeta))};
  std::vector<at::Tensor> mixed{torch::ones({3}), meta[0]};
  const auto message = [&](std::vector<at::Tensor>& t) {
    try {
      g.all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.devices"));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(meta).find("has tensors on meta, which this group's transports (in-memory) do not carry"),
            std::string::npos)
      << message(meta);
  EXPECT_NE(message(mixed).find("all_reduce at test.devices"), std::string::npos) << message(mixed);
  EXPECT_NE(message(mixed).find("mixes tensors on cpu and meta"), std::string::npos) << message(mixed);
  // What the trainer asks before it puts a model on a device.
  EXPECT_TRUE(g.carries(torch::Device(torch::kCPU)));
  EXPECT_FALSE(g.carries(torch::Device(torch::kCUDA, 0)));
  EXPECT_FALSE(g.carries(torch::Device(torch::kMeta)));
  EXPECT_TRUE(make_single_process_group()->carries(torch::Device(torch::kCUDA, 0)));  // moves nothing
  std::vector<at::Tensor> ok{torch::ones({2})};
  g.all_reduce(ok, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.after"));
  const auto gathered = g.all_gather(torch::ones({2}), LOCKSTEP_CALL_SITE("test.sequence"));
  EXPECT_EQ(gathered.size(), 1u);
}

// Failure mode e: one rank runs out of batches (forced here; the global data plan, docs/data.md, prevents it)
// and moves on to the end of the epoch while the others still sync gradients: every rank gets
// CollectiveMismatch at the point of divergence naming the rank that ran out, not a timeout.
TEST(ProcessGroup, ARankThatRunsOutOfBatchesIsNamedAtTheDivergence) {
  std::vector<std::string> messages(3);
  std::vector<double> seconds(3);
  const auto errors = run_ranks(3, [&](Group& g, int r) {
    const int batches = r == 1 ? 4 : 6;
    const auto start = std::chrono::steady_clock::now();
    try {
      for (int b = 0; b < batches; ++b) {
        std::vector<at::Tensor> grads{torch::ones({8}), torch::ones({3, 3})};
        g.all_reduce(grads, ReduceOp::Sum, LOCKSTEP_CALL_SITE("train.grads"));
      }
      g.barrier(LOCKSTEP_CALL_SITE("epoch.end"));
    } catch (const CollectiveMismatch& e) {
      messages[r] = e.what();
      seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  });
  expect_no_errors(errors);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(messages[r].find("rank 1: #5 barrier at epoch.end"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("rank 0: #5 all_reduce(sum) of [float32 (8), float32 (3, 3)] at train.grads"),
              std::string::npos)
        << messages[r];
    EXPECT_LT(seconds[r], test_util::kFarBelowTheTimeoutS) << "rank " << r;
  }
}

// The timeout is for stalls: a rank that takes longer than the timeout to reach a collective but
// publishes progress meanwhile (scanning an image folder, say) is waited for; one that goes
// silent for the timeout is reported.
TEST(ProcessGroup, TheTimeoutRunsFromTheLastProgressAnotherRankPublished) {
  CollectiveOptions opts(LOCKSTEP_CALL_SITE("test.after_long_work"));
  opts.timeout = std::chrono::milliseconds(1000);
  std::vector<double> seconds(2);
  const auto working = run_ranks(2, [&](Group& g, int r) {
    const auto start = std::chrono::steady_clock::now();
    if (r == 1) {
      for (int i = 0; i < 12; ++i) {  // 2.4 s of work, over twice the timeout, progress every 0.2 s
        g.set_progress("scanning: " + std::to_string(i) + " of 12");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    std::vector<at::Tensor> t{torch::ones({4})};
    g.all_reduce(t, ReduceOp::Sum, opts);
    EXPECT_TRUE(torch::equal(t[0], torch::full({4}, 2.0f)));
    seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  expect_no_errors(working);
  EXPECT_GT(seconds[0], 2.0);  // rank 0 waited well past its timeout

  std::string message;
  const auto silent = run_ranks(2, [&](Group& g, int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // no progress
    std::vector<at::Tensor> t{torch::ones({4})};
    try {
      g.all_reduce(t, ReduceOp::Sum, opts);
    } catch (const CollectiveTimeout& e) {
      if (r == 0) {
        message = e.what();
        EXPECT_EQ(e.waiting_for(), std::vector<int>{1});
      }
    }
  });
  EXPECT_NE(message.find("timed out after 1000 ms waiting for rank(s) 1"), std::string::npos) << message;
}

// After a collective failed, ranks stand at different points: the next collective is refused at
// once, naming the one that failed, instead of being attempted against peers that are elsewhere.
TEST(ProcessGroup, AGroupWhoseCollectiveFailedRefusesTheNextNamingTheFailure) {
  CollectiveOptions stalled(LOCKSTEP_CALL_SITE("test.stalled"));
  stalled.timeout = std::chrono::milliseconds(500);
  std::string first, next;
  const auto errors = run_ranks(2, [&](Group& g, int r) {
    if (r == 1) {  // never joins, and keeps its group alive until rank 0 is done
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return;
    }
    std::vector<at::Tensor> t{torch::ones({4})};
    try {
      g.all_reduce(t, ReduceOp::Sum, stalled);
    } catch (const CollectiveTimeout& e) {
      first = e.what();
    }
    try {
      g.barrier(LOCKSTEP_CALL_SITE("test.next"));
    } catch (const CollectiveFailure& e) {
      next = e.what();
    }
  });
  EXPECT_NE(first.find("test.stalled"), std::string::npos) << first;
  EXPECT_NE(next.find("rank 0 of 2: barrier at test.next"), std::string::npos) << next;
  EXPECT_NE(next.find("unusable since #1 all_reduce(sum)"), std::string::npos) << next;
  EXPECT_NE(next.find("test.stalled"), std::string::npos) << next;
}

TEST(ProcessGroup, ARankThatNeverArrivesIsNamed) {
  GroupOptions o = test_util::local_options(0, 3, 0);
  o.connect_timeout = std::chrono::milliseconds(1500);  // TCPStore's socket counts whole seconds
  try {
    make_process_group(o);
    FAIL() << "connected without ranks 1 and 2";
  } catch (const CollectiveFailure& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 did not arrive"), std::string::npos) << e.what();
  }
}

TEST(ProcessGroup, AnUnreachableMasterIsNamed) {
  GroupOptions o = test_util::local_options(1, 2, test_util::free_port());
  o.connect_timeout = std::chrono::milliseconds(1500);
  try {
    make_process_group(o);
    FAIL() << "connected to nobody";
  } catch (const CollectiveFailure& e) {
    EXPECT_NE(
        std::string(e.what()).find("cannot reach the master's store at 127.0.0.1:" + std::to_string(o.master_port)),
        std::string::npos)
        << e.what();
  }
}

// Sets environment variables for one test and restores them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> values) {
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
    for (const auto& [k, v] : values) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::string env_error(std::vector<std::pair<std::string, std::string>> values) {
  ScopedEnv env(std::move(values));
  try {
    GroupOptions::from_environment();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(ProcessGroup, EnvironmentIsReadAndCheckedLikeTorchrunSetsIt) {
  {
    ScopedEnv env({{"RANK", "2"},
                   {"WORLD_SIZE", "4"},
                   {"MASTER_ADDR", "10.0.0.5"},
                   {"MASTER_PORT", "1234"},
                   {"LOCAL_RANK", "0"},
                   {"LOCAL_WORLD_SIZE", "2"}});
    EXPECT_TRUE(GroupOptions::environment_has_ranks());
    const GroupOptions o = GroupOptions::from_environment();
    EXPECT_EQ(o.rank, 2);
    EXPECT_EQ(o.size, 4);
    EXPECT_EQ(o.master_addr, "10.0.0.5");
    EXPECT_EQ(o.master_port, 1234);
  }
  {
    ScopedEnv env({});
    EXPECT_FALSE(GroupOptions::environment_has_ranks());
    EXPECT_EQ(GroupOptions::from_environment().size, 1);
  }
  EXPECT_NE(env_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("RANK=4 must lie in [0, WORLD_SIZE=4)"),
            std::string::npos);
  EXPECT_NE(env_error({{"RANK", "one"}, {"WORLD_SIZE", "4"}}).find("RANK='one' is not an integer"), std::string::npos);
  EXPECT_NE(env_error({{"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0 must be >= 1"), std::string::npos);
  EXPECT_NE(env_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
                .find("LOCAL_RANK=2 must lie in [0, LOCAL_WORLD_SIZE=2)"),
            std::string::npos);
  EXPECT_NE(env_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}).find("master port 70000"),
            std::string::npos);
}

// Failure mode b (docs/guarantees.md, G4): LFQ's entropy loss and its gradient on 2 ranks equal the 1-rank values
// (losses averaged over ranks, gradients averaged as data parallelism does).
TEST(ProcessGroup, LfqEntropyLossAndGradientOnTwoRanksEqualOneRank) {
  const quant::LfqOptions options = quant::LfqOptions(64).commitment_loss_weight(0.5);
  const at::Tensor x = torch::empty({4, 12, 6}).normal_(0, 0.3, at::detail::createCPUGenerator(3));
  quant::Lfq single(options);
  const at::Tensor x1 = x.clone().requires_grad_();
  const at::Tensor loss1 = single.quantize(x1, {}).total_loss();
  loss1.backward();

  std::vector<at::Tensor> losses(2), grads(2);
  expect_no_errors(run_ranks(2, [&](Group& g, int r) {
    quant::Lfq lfq(options);
    auto shared = std::shared_ptr<Group>(&g, [](Group*) {});
    GroupReducer reducer(shared);
    const PhaseScope step(g, Phase::train_step(1));
    const at::Tensor xr = x.narrow(0, 2 * r, 2).clone().requires_grad_();
    const at::Tensor loss = lfq.quantize(xr, {&reducer, {}}).total_loss();
    loss.backward();
    losses[r] = loss.detach();
    grads[r] = xr.grad();
  }));
  ASSERT_TRUE(losses[0].defined() && losses[1].defined());
  EXPECT_NEAR(((losses[0] + losses[1]) / 2).item<double>(), loss1.item<double>(), 1e-6);
  const at::Tensor averaged = torch::cat({grads[0], grads[1]}) / 2;
  EXPECT_TRUE(torch::allclose(averaged, x1.grad(), 1e-5, 1e-7)) << (averaged - x1.grad()).abs().max();
}

}  // namespace
}  // namespace lockstep::dist
