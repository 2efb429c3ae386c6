#include "lockstep/train/grad_clip.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace lockstep::train {
namespace {

// Parameters with the given gradients (an empty vector: no gradient).
std::vector<at::Tensor> with_grads(const std::vector<std::vector<float>>& grads) {
  std::vector<at::Tensor> params;
  for (const auto& g : grads) {
    at::Tensor p = torch::zeros({static_cast<int64_t>(std::max<size_t>(g.size(), 1))}, torch::requires_grad());
    if (!g.empty()) p.mutable_grad() = torch::tensor(g);
    params.push_back(p);
  }
  return params;
}

TEST(GradClip, TheNormIsOverAllGradientsAndThoseWithoutOneCountAsZero) {
  const auto params = with_grads({{3.0f}, {}, {0.0f, 4.0f}});
  EXPECT_DOUBLE_EQ(global_grad_norm(params), 5.0);
  EXPECT_DOUBLE_EQ(global_grad_norm({}), 0.0);
}

TEST(GradClip, ScalesEveryGradientToTheLimitOnlyWhenTheNormExceedsIt) {
  auto params = with_grads({{3.0f}, {0.0f, 4.0f}});
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 1.0), 5.0);  // the norm before clipping
  EXPECT_NEAR(global_grad_norm(params), 1.0, 1e-6);
  EXPECT_TRUE(torch::allclose(params[0].grad(), torch::tensor({0.6f})));
  EXPECT_TRUE(torch::allclose(params[1].grad(), torch::tensor({0.0f, 0.8f})));
  EXPECT_NEAR(clip_grad_norm(params, 2.0), 1.0, 1e-6);  // under the limit: unchanged
  EXPECT_TRUE(torch::allclose(params[0].grad(), torch::tensor({0.6f})));
}

TEST(GradClip, ANonFiniteNormLeavesTheGradientsForTheLossCheck) {
  auto params = with_grads({{std::numeric_limits<float>::infinity()}, {1.0f}});
  EXPECT_TRUE(std::isinf(clip_grad_norm(params, 1.0)));
  EXPECT_EQ(params[1].grad().item<float>(), 1.0f);
}

}  // namespace
}  // namespace lockstep::train
