#include "lockstep/quant/binary_mapper.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {

TEST(BinaryMapper, DeterministicBitsGiveTheIndexOfTheirCodeLowBitFirst) {
  const BinaryMapper mapper(BinaryMapperOptions(3));
  const at::Tensor logits = torch::tensor({{2.0f, -1.0f, 3.0f}, {-2.0f, -0.5f, -4.0f}});  // bits 101, 000
  const BinaryMapping out = mapper.map(logits, 1.0, false, true);
  EXPECT_TRUE(torch::equal(out.indices, torch::tensor({5, 0}, torch::kInt64)));
  ASSERT_EQ(out.one_hot.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(out.one_hot.sum().item<float>(), 2.0f);
  EXPECT_EQ(out.one_hot[0][5].item<float>(), 1.0f);
  // Code k's bits are k's binary digits, lowest first.
  const at::Tensor codes = mapper.codes(at::kCPU);
  EXPECT_TRUE(torch::equal(codes[5], torch::tensor({true, false, true})));
}

TEST(BinaryMapper, TheStraightThroughGradientIsThatOfTheCodesJointProbability) {
  const BinaryMapper mapper(BinaryMapperOptions(2));
  const at::Tensor logits = torch::tensor({{0.3f, -1.2f}}).requires_grad_(true);
  const BinaryMapping out = mapper.map(logits, 1.0, true, true);
  out.one_hot[0][2].backward();  // code 2: bit 0 off, bit 1 on: p = sigmoid(-l0) sigmoid(l1)
  const double s0 = 1 / (1 + std::exp(-0.3)), s1 = 1 / (1 + std::exp(1.2));
  const double p = (1 - s0) * s1;
  EXPECT_NEAR(logits.grad()[0][0].item<double>(), -p * s0, 1e-6);  // d/dl0 of log(1 - s0) is -s0
  EXPECT_NEAR(logits.grad()[0][1].item<double>(), p * (1 - s1), 1e-6);
}

TEST(BinaryMapper, TheKlLossIsTheEntropyShortfallBeyondTheThreshold) {
  const BinaryMapper mapper(BinaryMapperOptions(2).kl_loss_threshold(0.1));
  const at::Tensor logits = torch::tensor({{0.0f, 0.0f}, {5.0f, -5.0f}});
  const at::Tensor per_token = mapper.aux_kl_loss(logits, false);
  EXPECT_NEAR(per_token[0].item<double>(), 0.0, 1e-7);  // fair bits: full entropy
  const double s = 1 / (1 + std::exp(-5.0));
  const double h = -(s * std::log(s) + (1 - s) * std::log(1 - s));
  EXPECT_NEAR(per_token[1].item<double>(), 2 * std::log(2.0) - 2 * h - 0.1, 1e-5);
  const at::Tensor log_p = mapper.log_prob(logits, torch::tensor({1, 1}), true);
  EXPECT_NEAR(log_p[1].item<double>(), std::log(s) + std::log(s), 1e-5);  // bit 0 on, bit 1 off
}

TEST(BinaryMapper, BadInputIsRefusedWithTheValues) {
  EXPECT_THROW(BinaryMapper(BinaryMapperOptions(0)), InvalidArgument);
  const BinaryMapper mapper(BinaryMapperOptions(4));
  EXPECT_THROW(mapper.map(torch::randn({2, 3}), 1.0, false, false), InvalidArgument);
  EXPECT_THROW(mapper.log_prob(torch::randn({2, 4}), torch::tensor({16, 0}), true), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::quant
