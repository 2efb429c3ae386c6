// Latent quantization against its definition (docs/quantizers.md): per-channel nearest values, the
// mixed-radix index, straight-through gradients and the two training losses.
#include "lockstep/quant/latent_quantize.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {

TEST(LatentQuantize, EachChannelTakesItsNearestValueAndTheIndexIsMixedRadix) {
  LatentQuantize q(LatentQuantizeOptions({3, 4}));
  // Level 3: -0.5, 0, 0.5; level 4: -0.5, -0.25, 0, 0.25.
  const at::Tensor x = torch::tensor({0.3f, -0.2f, -0.6f, 0.4f, 0.1f, 0.05f}).reshape({1, 3, 2});
  const QuantizerOutput out = q.quantize(x, {});
  const at::Tensor expected = torch::tensor({0.5f, -0.25f, -0.5f, 0.25f, 0.0f, 0.0f}).reshape({1, 3, 2});
  EXPECT_TRUE(torch::allclose(out.quantized, expected));
  // index = p0 + 3 p1: (2, 1) -> 5, (0, 3) -> 9, (1, 2) -> 7
  EXPECT_TRUE(torch::equal(out.indices, torch::tensor({5, 9, 7}, torch::kInt64).reshape({1, 3})));
  EXPECT_TRUE(torch::equal(q.encode(x), out.indices));
  EXPECT_TRUE(torch::allclose(q.decode(out.indices), expected));
  const at::Tensor all = torch::arange(12, torch::kInt64).reshape({1, 12});
  EXPECT_TRUE(torch::equal(q.encode(q.decode(all)), all));
}

TEST(LatentQuantize, TrainingLossesAreWeightedAndGradientsPassStraightThrough) {
  LatentQuantize q(LatentQuantizeOptions({5, 5}).commitment_loss_weight(0.3).quantization_loss_weight(0.7));
  torch::manual_seed(2);
  const at::Tensor x = torch::randn({2, 4, 2}).requires_grad_(true);
  const QuantizerOutput out = q.quantize(x, {});
  const double mse = (out.quantized.detach() - x.detach()).pow(2).mean().item<double>();
  EXPECT_NEAR(out.losses.at("commitment").item<double>(), 0.3 * mse, 1e-7);
  EXPECT_NEAR(out.losses.at("quantization").item<double>(), 0.7 * mse, 1e-7);
  out.quantized.sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), torch::ones_like(x)));  // straight-through
  q.eval();
  EXPECT_TRUE(q.quantize(x, {}).losses.empty());  // losses in training only, as the reference
}

TEST(LatentQuantize, OptionsAreValidated) {
  EXPECT_THROW(LatentQuantize(LatentQuantizeOptions({})), InvalidArgument);
  EXPECT_THROW(LatentQuantize(LatentQuantizeOptions({5, 1})), InvalidArgument);
  EXPECT_THROW(LatentQuantize(LatentQuantizeOptions({5}).commitment_loss_weight(-1)), InvalidArgument);
  LatentQuantize q(LatentQuantizeOptions({5, 5}).num_codebooks(2));
  EXPECT_THROW(q.decode(torch::zeros({1, 3}, torch::kInt64)), InvalidArgument);
  EXPECT_THROW(q.decode(torch::full({1, 1, 2}, 25, torch::kInt64)), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::quant
