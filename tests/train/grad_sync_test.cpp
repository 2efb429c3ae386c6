#include "lockstep/train/grad_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

#include "dist/rank_threads.h"

namespace lockstep::train {
namespace {

// A little network, built identically on every rank from one seed.
torch::nn::Sequential make_net() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(6, 32), torch::nn::Tanh(), torch::nn::Linear(32, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, 2));
}

// Each parameter's gradient averaged over `ranks` fresh nets, after `backward(rank, net)` on each.
std::vector<at::Tensor> mean_over_ranks(int ranks, const std::function<void(int, torch::nn::Sequential&)>& backward) {
  std::vector<at::Tensor> mean;
  for (int r = 0; r < ranks; ++r) {
    auto net = make_net();
    backward(r, net);
    const auto params = net->parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      const at::Tensor g = params[k].grad() / ranks;
      if (r == 0)
        mean.push_back(g.clone());
      else
        mean[k] += g;
    }
  }
  return mean;
}

TEST(GradientSync, GradientsBecomeTheMeanOverRanksWhateverTheBuckets) {
  for (const int64_t bucket_bytes : {int64_t{1} << 20, int64_t{600}, int64_t{1}}) {
    SCOPED_TRACE(::testing::Message() << "bucket bytes " << bucket_bytes);
    constexpr int kRanks = 3;
    std::vector<torch::nn::Sequential> nets;
    for (int r = 0; r < kRanks; ++r) nets.push_back(make_net());  // built before the threads: one generator
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < kRanks; ++r)
      inputs.push_back(torch::empty({5, 6}).normal_(0, 1, at::detail::createCPUGenerator(r)));
    // The expected mean, from local backwards.
    const std::vector<at::Tensor> expected = mean_over_ranks(
        kRanks, [&](int r, torch::nn::Sequential& net) { net->forward(inputs[r]).pow(2).sum().backward(); });
    std::vector<int64_t> buckets(kRanks);
    std::vector<at::Tensor> controls(kRanks);
    const auto errors = dist::test_util::run_ranks(kRanks, [&](dist::Group& g, int r) {
      auto& net = nets[r];
      GradientSync sync(std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}), net->parameters(), bucket_bytes);
      buckets[r] = sync.buckets();
      for (int step = 0; step < 2; ++step) {  // the second step reuses the buckets
        sync.begin(torch::tensor({float(r), 1.0f}));
        for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
        net->forward(inputs[r]).pow(2).sum().backward();
        controls[r] = sync.finish();
        for (size_t k = 0; k < net->parameters().size(); ++k) {
          EXPECT_TRUE(torch::allclose(net->parameters()[k].grad(), expected[k], 1e-5, 1e-6))
              << "rank " << r << " step " << step << " parameter " << k;
        }
      }
    });
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_FALSE(errors[r]) << dist::test_util::message_of<std::exception>(errors[r]);
      EXPECT_TRUE(torch::equal(controls[r], torch::tensor({3.0f, 3.0f})));  // 0 + 1 + 2, 1 + 1 + 1
    }
    // Reverse order: {b3 8 B, w3 128 B, b2 64 B} fit 600 bytes, then w2 (2048 B), b1 and w1 each
    // alone: 4 buckets; everything in one at 1 MiB; one per parameter at 1 byte.
    const int64_t expected_buckets = bucket_bytes == (int64_t{1} << 20) ? 1 : bucket_bytes == 600 ? 4 : 6;
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(buckets[r], expected_buckets);
  }
}

TEST(GradientSync, SharedParametersAreSummedButASecondBackwardIsAnError) {
  const auto errors = dist::test_util::run_ranks(2, [&](dist::Group& g, int r) {
    torch::manual_seed(1);
    auto lin = torch::nn::Linear(3, 3);
    GradientSync sync(std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}), lin->parameters(), 1 << 20);
    const at::Tensor x = torch::ones({1, 3}) * (r + 1);
    // The layer used twice in one forward: its hook sees the summed gradient once.
    sync.begin(torch::zeros({1}));
    const at::Tensor loss = lin->forward(lin->forward(x)).sum();
    loss.backward({}, /*retain_graph=*/true);
    sync.finish();
    const at::Tensor synced = lin->weight.grad().clone();
    EXPECT_TRUE(torch::isfinite(synced).all().item<bool>());
    // Two backwards in one step: the second gradient cannot join buckets already sent.
    sync.begin(torch::zeros({1}));
    loss.backward({}, /*retain_graph=*/true);
    try {
      loss.backward();
      ADD_FAILURE() << "rank " << r << " accepted a second backward";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("received gradient 2 in a step of 1 backward pass(es)"), std::string::npos)
          << e.what();
    }
    sync.finish();
  });
  for (const auto& e : errors) EXPECT_FALSE(e) << dist::test_util::message_of<std::exception>(e);
}

// Gradient accumulation: k backward passes per step sum into the buckets, which go out during the
// last; the result is the mean over ranks of each rank's summed gradients.
TEST(GradientSync, AccumulatedPassesAreSummedThenAveraged) {
  constexpr int kRanks = 2, kPasses = 3;
  std::vector<torch::nn::Sequential> nets;
  for (int r = 0; r < kRanks; ++r) nets.push_back(make_net());
  auto input = [](int r, int pass) {
    return torch::empty({4, 6}).normal_(0, 1, at::detail::createCPUGenerator(10 * r + pass));
  };
  const std::vector<at::Tensor> expected = mean_over_ranks(kRanks, [&](int r, torch::nn::Sequential& net) {
    for (int pass = 0; pass < kPasses; ++pass) net->forward(input(r, pass)).pow(2).sum().backward();
  });
  std::vector<at::Tensor> controls(kRanks);
  const auto errors = dist::test_util::run_ranks(kRanks, [&](dist::Group& g, int r) {
    auto& net = nets[r];
    GradientSync sync(std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}), net->parameters(), 600);
    sync.begin_accumulation(kPasses);
    for (int pass = 0; pass < kPasses; ++pass) {
      if (pass == kPasses - 1) sync.set_control(torch::tensor({float(r + 1)}));
      net->forward(input(r, pass)).pow(2).sum().backward();
    }
    controls[r] = sync.finish();
    for (size_t k = 0; k < net->parameters().size(); ++k) {
      EXPECT_TRUE(torch::allclose(net->parameters()[k].grad(), expected[k], 1e-5, 1e-6))
          << "rank " << r << " parameter " << k;
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_FALSE(errors[r]) << dist::test_util::message_of<std::exception>(errors[r]);
    EXPECT_TRUE(torch::equal(controls[r], torch::tensor({3.0f})));
  }
  // The control must be in place before the last pass sends the last bucket.
  auto net = make_net();
  GradientSync sync(dist::make_single_process_group(), net->parameters(), 1 << 20);
  sync.begin_accumulation(2);
  net->forward(input(0, 0)).sum().backward();
  try {
    net->forward(input(0, 1)).sum().backward();
    ADD_FAILURE() << "the last bucket went out without a control tensor";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("before set_control()"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::train
