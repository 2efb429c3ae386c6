// The reconstruction objective: each weighted term a mean over the batch, added; weight 0 leaves a
// term out; the perceptual term needs an LPIPS network.
#include "lockstep/train/losses.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "error_of.h"
#include "lockstep/core/error.h"
#include "model/random_lpips.h"

namespace lockstep::train {
namespace {
using test_util::error_of;

TEST(ReconstructionLoss, WeightedTermsAddUp) {
  torch::manual_seed(4);
  const at::Tensor x = torch::rand({3, 3, 16, 16}) * 2 - 1, y = torch::rand({3, 3, 16, 16}) * 2 - 1;
  const double l2 = (y - x).pow(2).mean().item<double>(), l1 = (y - x).abs().mean().item<double>();
  EXPECT_NEAR(reconstruction_loss(y, x, {}, nullptr).item<double>(), l2, 1e-6);  // the default: L2 alone
  EXPECT_NEAR(reconstruction_loss(y, x, ReconstructionLossOptions().l2(2.5).l1(0.5), nullptr).item<double>(),
              2.5 * l2 + 0.5 * l1, 1e-6);
  EXPECT_NEAR(reconstruction_loss(y, x, ReconstructionLossOptions().l2(0).l1(1), nullptr).item<double>(), l1, 1e-6);
  EXPECT_EQ(reconstruction_loss(y, x, ReconstructionLossOptions().l2(0), nullptr).item<double>(), 0.0);

  model::Lpips lpips(test_util::random_lpips_weights(7), "w");
  const double perceptual = lpips->forward(y, x).mean().item<double>();
  EXPECT_GT(perceptual, 0);
  EXPECT_NEAR(reconstruction_loss(y, x, ReconstructionLossOptions().l1(2).perceptual(0.3), lpips.get()).item<double>(),
              l2 + 2 * l1 + 0.3 * perceptual, 1e-5);
  EXPECT_NE(error_of<InvalidArgument>([&] {
              reconstruction_loss(y, x, ReconstructionLossOptions().perceptual(0.3), nullptr);
            }).find("perceptual weight 0.3 without an LPIPS network (loss.lpips_weights)"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::train
