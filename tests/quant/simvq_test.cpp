// SimVQ against its definition (docs/quantizers.md): the nearest code of the implicit codebook, the
// two-part commitment loss and where each part's gradient goes.
#include "lockstep/quant/simvq.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {

std::shared_ptr<SimVq> make(bool rotation_trick, int64_t frozen_dim = 0) {
  torch::manual_seed(3);
  SimVqOptions options(4, 16);
  options.rotation_trick(rotation_trick).input_to_quantize_commit_loss_weight(0.25).commitment_weight(2.0);
  if (frozen_dim) options.frozen_codebook_dim(frozen_dim);
  return std::make_shared<SimVq>(options);
}

TEST(SimVq, TheOutputIsTheNearestImplicitCodeAndTheLossHasItsTwoWeightedParts) {
  const auto q = make(true, 6);
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({2, 5, 4});
  const QuantizerOutput out = q->quantize(x, {});
  const at::Tensor codebook = q->implicit_codebook().detach();
  EXPECT_EQ(codebook.sizes(), (std::vector<int64_t>{16, 4}));
  const at::Tensor expected_indices = torch::cdist(x.reshape({10, 4}), codebook).argmin(1).reshape({2, 5});
  EXPECT_TRUE(torch::equal(out.indices, expected_indices));
  const at::Tensor codes = codebook.index_select(0, expected_indices.reshape({-1})).reshape({2, 5, 4});
  EXPECT_TRUE(torch::allclose(out.quantized, codes, 1e-5, 1e-6));
  const double mse = (codes - x).pow(2).mean().item<double>();
  EXPECT_NEAR(out.losses.at("commitment").item<double>(), 2.0 * (1.0 + 0.25) * mse, 1e-6);
  EXPECT_TRUE(torch::equal(q->decode(out.indices).detach(), out.quantized.detach()) ||
              torch::allclose(q->decode(out.indices), out.quantized, 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(q->encode(x), out.indices));
}

// The map learns from mse(sg(x), q) alone; the tokens get the straight-through gradient plus the pull
// of 0.25 mse(x, sg(q)).
TEST(SimVq, StraightThroughGradientsFollowTheDefinition) {
  const auto q = make(false);
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({3, 4, 4}).requires_grad_(true);
  const QuantizerOutput out = q->quantize(x, {});
  const at::Tensor upstream = torch::randn({3, 4, 4});
  ((out.quantized * upstream).sum() + out.total_loss()).backward();
  const at::Tensor codes = out.quantized.detach();
  const double n = static_cast<double>(x.numel());
  const at::Tensor expected_x = upstream + 2.0 * 0.25 * 2.0 * (x.detach() - codes) / n;
  EXPECT_TRUE(torch::allclose(x.grad(), expected_x, 1e-5, 1e-6));
  // d/dW of 2 * mse(sg(x), W f_idx) = 2 * 2 (q - x) f_idx^T / n, summed over tokens.
  const at::Tensor frozen = q->frozen_codebook().index_select(0, out.indices.reshape({-1}));
  const at::Tensor expected_w = torch::matmul((codes - x.detach()).reshape({-1, 4}).t(), frozen) * (2.0 * 2.0 / n);
  const at::Tensor weight = q->named_parameters()["code_transform.weight"];
  EXPECT_TRUE(torch::allclose(weight.grad(), expected_w, 1e-5, 1e-6));
}

TEST(SimVq, TheRotationTrickKeepsTheCodesValueAndTrainsTheMapOnlyThroughTheLoss) {
  const auto q = make(true);
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({2, 3, 4}).requires_grad_(true);
  const QuantizerOutput out = q->quantize(x, {});
  out.quantized.sum().backward();  // no loss: the output alone must not reach the map
  const at::Tensor weight = q->named_parameters()["code_transform.weight"];
  EXPECT_TRUE(!weight.grad().defined() || torch::equal(weight.grad(), torch::zeros_like(weight)));
  EXPECT_TRUE(x.grad().defined());
}

TEST(SimVq, ShapesAndWeightsAreValidated) {
  EXPECT_THROW(SimVq(SimVqOptions(0, 8)), InvalidArgument);
  EXPECT_THROW(SimVq(SimVqOptions(4, 8).commitment_weight(-1)), InvalidArgument);
  EXPECT_THROW(SimVq(SimVqOptions(4, 8).frozen_codebook_dim(0)), InvalidArgument);
  SimVq q(SimVqOptions(4, 8));
  EXPECT_THROW(q.quantize(torch::randn({2, 3, 5}), {}), InvalidArgument);
  EXPECT_THROW(q.decode(torch::full({1, 2}, 8, torch::kInt64)), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::quant
