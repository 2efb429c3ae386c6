#include "lockstep/train/weight_ema.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {

struct Net : torch::nn::Module {
  explicit Net(int64_t width) {
    weight = register_parameter("weight", torch::zeros({width}));
    counts = register_buffer("counts", torch::zeros({width}));
  }
  at::Tensor weight, counts;
};

TEST(WeightEma, ParametersMoveByTheDecayAndBuffersAreCopied) {
  Net model(3), average(3);
  {
    torch::NoGradGuard no_grad;
    model.weight.copy_(torch::tensor({1.0f, 2.0f, 4.0f}));
    model.counts.copy_(torch::tensor({7.0f, 8.0f, 9.0f}));
  }
  update_weight_ema(average, model, 0.75);
  EXPECT_TRUE(torch::allclose(average.weight, torch::tensor({0.25f, 0.5f, 1.0f})));
  EXPECT_TRUE(torch::equal(average.counts, model.counts));
  update_weight_ema(average, model, 0.75);  // a <- 0.75 a + 0.25 p again
  EXPECT_TRUE(torch::allclose(average.weight, torch::tensor({0.4375f, 0.875f, 1.75f})));
  update_weight_ema(average, model, 0.0);  // decay 0: the model itself
  EXPECT_TRUE(torch::equal(average.weight, model.weight));
}

TEST(WeightEma, ADecayOutOfRangeOrAnotherModelIsNamed) {
  Net model(3), other(4);
  EXPECT_THROW(update_weight_ema(other, model, 1.0), InvalidArgument);
  try {
    update_weight_ema(other, model, 0.9);
    FAIL() << "models of other shapes were averaged";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'weight'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::train
