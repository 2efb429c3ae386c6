#include "lockstep/quant/fsp.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "lockstep/core/error.h"
#include "recording_reducer.h"

namespace lockstep::quant {
namespace {

QuantizeContext seeded_context(uint64_t seed, int64_t first_item = 0, Reducer* reducer = nullptr) {
  QuantizeContext ctx;
  ctx.generator = at::detail::createCPUGenerator(seed);
  ctx.first_item = first_item;
  ctx.reducer = reducer;
  return ctx;
}

// The definition (docs/quantizers.md) written out for tanh, levels (4, 3), no projection.
TEST(Fsp, EvaluationSnapsEachChannelToItsBinsMidpoint) {
  Fsp fsp(FspOptions({4, 3}));
  fsp.eval();
  const at::Tensor z = torch::tensor({0.0f, 0.0f, -3.0f, 3.0f, 0.3f, -0.3f, 20.0f, -20.0f}).reshape({1, 4, 2});
  const QuantizerOutput out = fsp.quantize(z, QuantizeContext{});
  const at::Tensor a = (torch::tanh(z) + 1) / 2;
  const at::Tensor levels = torch::tensor({4.0f, 3.0f});
  const at::Tensor bins = (a.clamp_max(1 - 1.1920929e-07) * levels).floor();
  EXPECT_TRUE(torch::allclose(out.quantized, ((bins + 0.5) / levels - 0.5) / 0.28867513459481287, 1e-6, 1e-6));
  EXPECT_TRUE(torch::equal(out.indices, (bins.select(-1, 0) + 4 * bins.select(-1, 1)).to(torch::kInt64)));
  EXPECT_EQ(out.indices[0][3].item<int64_t>(), 3 + 4 * 0) << "tanh(20) = 1 falls in the last bin";
  EXPECT_TRUE(torch::equal(fsp.encode(z), out.indices));
  EXPECT_TRUE(torch::allclose(fsp.decode(out.indices), out.quantized, 1e-6, 1e-6));
  EXPECT_TRUE(torch::equal(fsp.level_indices(out.indices), bins.to(torch::kInt64)));
}

TEST(Fsp, EachActivationIsACdfAndItsInverseReturnsTheBin) {
  for (const char* name : {"tanh", "sigmoid", "normal", "laplace", "cauchy"}) {
    Fsp fsp(FspOptions({5, 5}).activation(fsp_activation(name)).need_inv_act(true).quantize_rate(1.0));
    const at::Tensor z = torch::linspace(-3, 3, 26).reshape({1, 13, 2});
    fsp.eval();
    const QuantizerOutput out = fsp.quantize(z, QuantizeContext{});
    const at::Tensor again = fsp.quantize(out.quantized, QuantizeContext{}).indices;
    EXPECT_TRUE(torch::equal(again, out.indices)) << name << ": the inverse lands in the same bin";
    EXPECT_TRUE(torch::equal(fsp.decode(out.indices), out.quantized)) << name;
    // Monotone: a larger latent never takes a lower bin.
    const at::Tensor first = fsp.level_indices(out.indices).select(-1, 0).reshape(-1);
    EXPECT_TRUE((first.slice(0, 1) >= first.slice(0, 0, -1)).all().item<bool>()) << name;
  }
  EXPECT_THROW(fsp_activation("relu"), InvalidArgument);
}

// The moments from float64 power sums equal torch's two-pass statistics, gradient included.
TEST(Fsp, NormLossFromPowerSumsEqualsTheBatchStatistics) {
  torch::manual_seed(3);
  const at::Tensor z = (torch::randn({40, 3}, torch::kDouble) * 1.7 + 0.4).requires_grad_(true);
  const FspNorm norm = FspNorm::preset("kurt");
  const at::Tensor sums =
      torch::cat({torch::full({1}, 40.0, z.options()), z.sum(0), z.pow(2).sum(0), z.pow(3).sum(0), z.pow(4).sum(0)});
  const at::Tensor got = fsp_norm_loss(sums, norm, 3);
  const auto [variance, mean] = torch::var_mean(z, 0, /*unbiased=*/true);
  const at::Tensor scores = (z - mean) / variance.sqrt();
  const at::Tensor skew = scores.pow(3).mean(0), kurt = scores.pow(4).mean(0) - 3;
  const at::Tensor expected = (mean - 0).pow(2).mean() * 0.1 + (variance - 1).pow(2).mean() * 0.07 +
                              skew.pow(2).mean() * 0.06 + kurt.pow(2).mean() * 0.05;
  EXPECT_NEAR(got.item<double>(), expected.item<double>(), 1e-10);
  const at::Tensor g_got = torch::autograd::grad({got}, {z})[0];
  const at::Tensor g_expected = torch::autograd::grad({expected}, {z})[0];
  EXPECT_TRUE(torch::allclose(g_got, g_expected, 1e-9, 1e-10));
  const at::Tensor one = torch::tensor({1.0, 2.0, 4.0, 8.0, 16.0}, torch::kDouble);  // one token of value 2
  EXPECT_TRUE(torch::isfinite(fsp_norm_loss(one, norm, 1)).item<bool>()) << "one token: variance 0, not n / 0";
  // A constant channel of a value power sums do not cancel exactly (0.3): skewness 0 and kurtosis -3,
  // as the reference's, not rounding over std^4 (1e15 before the guard).
  const at::Tensor constant = torch::full({64, 1}, 0.3, torch::kDouble);
  const at::Tensor constant_sums = torch::cat({torch::full({1}, 64.0, constant.options()), constant.sum(0),
                                               constant.pow(2).sum(0), constant.pow(3).sum(0), constant.pow(4).sum(0)});
  EXPECT_NEAR(fsp_norm_loss(constant_sums, norm, 1).item<double>(), 0.1 * 0.09 + 0.07 * 1 + 0.05 * 9, 1e-9);
}

// Training: the statistics are the global batch's (one reducer call), the draws the global batch's:
// two holders of the halves give the whole batch's outputs and loss.
TEST(Fsp, TwoHoldersGetTheWholeBatchsStatisticsAndDraws) {
  torch::manual_seed(8);
  Fsp fsp(FspOptions({5, 4, 3}).dim(6).quantize_rate(0.4));
  const at::Tensor x = torch::randn({4, 5, 6});
  const QuantizerOutput whole = fsp.quantize(x, seeded_context(7));
  test_util::RecordingReducer capture;  // the second holder's sums
  fsp.quantize(x.slice(0, 2), seeded_context(7, 2, &capture));
  ASSERT_EQ(capture.tags, std::vector<std::string>{"fsp.moments"});
  test_util::RecordingReducer two;
  two.other = capture.last_local;
  const QuantizerOutput first = fsp.quantize(x.slice(0, 0, 2), seeded_context(7, 0, &two));
  EXPECT_NEAR(first.losses.at("norm").item<float>(), whole.losses.at("norm").item<float>(), 1e-6);
  // (1e-6: the projections' matrix products round by the batch's size)
  EXPECT_TRUE(torch::allclose(first.quantized, whole.quantized.slice(0, 0, 2), 1e-6, 1e-6));
  const QuantizerOutput second = fsp.quantize(x.slice(0, 2), seeded_context(7, 2));
  EXPECT_TRUE(torch::allclose(second.quantized, whole.quantized.slice(0, 2), 1e-6, 1e-6)) << "the second half's draws";
  EXPECT_GT((fsp.quantize(x.slice(0, 2), seeded_context(7, 0)).quantized - second.quantized).abs().max().item<float>(),
            1e-3)
      << "another place in the batch, other draws";
}

TEST(Fsp, PerturbationStaysWithinHalfABinAndLeavesTheIndices) {
  torch::manual_seed(2);
  Fsp fsp(FspOptions({8, 8}).quantize_rate(0.0));
  const at::Tensor z = torch::randn({3, 50, 2});
  const QuantizerOutput trained = fsp.quantize(z, seeded_context(1));
  fsp.eval();
  const QuantizerOutput evaluated = fsp.quantize(z, seeded_context(1));
  fsp.train();
  EXPECT_TRUE(torch::equal(trained.indices, evaluated.indices));
  const at::Tensor a = (torch::tanh(z) + 1) / 2;
  const at::Tensor moved = trained.quantized * 0.28867513459481287 + 0.5 - a;  // the perturbation
  EXPECT_TRUE((moved.abs() <= 1.0 / 16 + 1e-6).all().item<bool>());
  EXPECT_GT(moved.abs().max().item<float>(), 0.01) << "rate 0: every element perturbed";
  Fsp always(FspOptions({8, 8}).quantize_rate(1.0));
  EXPECT_TRUE(torch::allclose(always.quantize(z, seeded_context(1)).quantized, evaluated.quantized, 0, 0));
  // The gradient reaches the latent through the activation: d/dz of (a - 1/2) / sqrt(1/12).
  const at::Tensor zg = z.clone().requires_grad_(true);
  fsp.quantize(zg, seeded_context(1)).quantized.sum().backward();
  const at::Tensor expected = (1 - torch::tanh(z).pow(2)) / 2 / 0.28867513459481287;
  EXPECT_TRUE(torch::allclose(zg.grad(), expected, 1e-5, 1e-6));
}

TEST(Fsp, EvaluationTakesTheHoldersOwnStatisticsAndCallsNothing) {
  Fsp fsp(FspOptions({5, 5}));
  fsp.eval();
  test_util::RecordingReducer reducer;
  const at::Tensor x = torch::randn({2, 7, 2});
  const QuantizerOutput out = fsp.quantize(x, seeded_context(1, 0, &reducer));
  EXPECT_TRUE(reducer.tags.empty());
  const FspDiagnostics d = fsp.diagnostics(x, seeded_context(1));
  const at::Tensor expected = (d.mean - 0).pow(2).mean() * 0.1 + (d.variance - 0.8225).pow(2).mean() * 0.07;
  EXPECT_NEAR(out.losses.at("norm").item<float>(), expected.item<float>(), 1e-6);
  EXPECT_FALSE(d.accept_rate.defined()) << "evaluation perturbs nothing";
  Fsp none(FspOptions({5, 5}).norm(FspNorm::preset("none")));
  test_util::RecordingReducer unused;
  const QuantizerOutput zero = none.quantize(x, seeded_context(1, 0, &unused));
  EXPECT_TRUE(unused.tags.empty()) << "no weight, no statistics to reduce";
  EXPECT_EQ(zero.losses.at("norm").item<float>(), 0.0f);
}

TEST(Fsp, InvalidOptionsNameTheValue) {
  const auto message = [](const FspOptions& o) {
    try {
      o.validate();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(FspOptions({})).find("levels must not be empty"), std::string::npos);
  EXPECT_NE(message(FspOptions({1, 5})).find("got 1"), std::string::npos);
  EXPECT_NE(message(FspOptions({5}).quantize_rate(1.5)).find("quantize_rate = 1.5"), std::string::npos);
  EXPECT_THROW(FspNorm::preset("varr"), InvalidArgument);
  EXPECT_EQ(message(FspOptions({5, 5}).dim(8)), "accepted");
}

}  // namespace
}  // namespace lockstep::quant
