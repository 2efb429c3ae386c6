#include "lockstep/quant/fsq.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/quant/registry.h"

namespace lockstep::quant {
namespace {

struct FsqCase {
  std::vector<int64_t> levels;
  bool symmetric;
};

class FsqDefinition : public ::testing::TestWithParam<FsqCase> {};

TEST_P(FsqDefinition, EveryIndexRoundTripsThroughItsCode) {
  Fsq fsq(FsqOptions(GetParam().levels).preserve_symmetry(GetParam().symmetric));
  const int64_t k = fsq.codebook_size();
  const at::Tensor all = torch::arange(k, torch::kInt64);
  const at::Tensor codes = fsq.indices_to_codes(all);
  EXPECT_TRUE(torch::equal(fsq.codes_to_indices(codes), all));
  // Codes are distinct and lie in [-1, 1].
  EXPECT_EQ(std::get<0>(torch::unique_dim(codes, 0)).size(0), k);
  EXPECT_LE(codes.abs().max().item<float>(), 1.0f);
}

TEST_P(FsqDefinition, QuantizedValuesAreCodesAndDecodeInvertsEncode) {
  torch::manual_seed(1);
  const auto& levels = GetParam().levels;
  Fsq fsq(FsqOptions(levels).preserve_symmetry(GetParam().symmetric));
  const at::Tensor x = torch::randn({3, 50, static_cast<int64_t>(levels.size())}) * 3;
  const QuantizerOutput out = fsq.quantize(x, {});
  ASSERT_EQ(out.indices.sizes(), (std::vector<int64_t>{3, 50}));
  EXPECT_GE(out.indices.min().item<int64_t>(), 0);
  EXPECT_LT(out.indices.max().item<int64_t>(), fsq.codebook_size());
  EXPECT_TRUE(torch::equal(fsq.encode(x), out.indices));
  EXPECT_TRUE(torch::allclose(fsq.decode(out.indices), out.quantized, 0, 1e-6));
  // Each dimension takes exactly levels[i] values over a wide sweep of inputs.
  const at::Tensor sweep = torch::linspace(-8, 8, 4001).unsqueeze(1).expand({4001, static_cast<int64_t>(levels.size())});
  const at::Tensor q = fsq.quantize_codes(sweep);
  for (size_t i = 0; i < levels.size(); ++i) {
    EXPECT_EQ(std::get<0>(at::_unique(q.select(1, i))).size(0), levels[i]) << "dimension " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, FsqDefinition,
                         ::testing::Values(FsqCase{{8, 5, 5, 5}, false}, FsqCase{{3, 4}, false},
                                           FsqCase{{2, 7, 6}, false}, FsqCase{{8, 5, 5, 5}, true},
                                           FsqCase{{3, 4}, true}));

TEST(Fsq, DefaultBoundMatchesHandComputedValues) {
  Fsq fsq(FsqOptions({5, 8}));
  // L = 5: half = 2.002, no offset: tanh(0.3) * 2.002 = 0.583 -> 1 -> 1/2; tanh(-2) * 2.002 = -1.93 -> -2 -> -1.
  // L = 8: half = 3.5035, offset 0.5, shift atanh(0.5 / 3.5035): z = 0 -> 0; z = 10 -> 3 / 4; z = -10 -> -4 / 4.
  const at::Tensor z = torch::tensor({0.3f, 0.0f, -2.0f, 10.0f, 5.0f, -10.0f}).reshape({3, 2});
  const at::Tensor expected = torch::tensor({0.5f, 0.0f, -1.0f, 0.75f, 1.0f, -1.0f}).reshape({3, 2});
  EXPECT_TRUE(torch::equal(fsq.quantize_codes(z), expected)) << fsq.quantize_codes(z);
}

TEST(Fsq, SymmetricBoundMatchesHandComputedValues) {
  Fsq fsq(FsqOptions({5}).preserve_symmetry(true));
  // 2/(L-1) * floor((L-1)(tanh z + 1)/2 + 0.5) - 1 with L = 5: z = 0 -> floor(2.5) = 2 -> 0;
  // z = 0.6: tanh = 0.537 -> floor(3.57) = 3 -> 0.5; z = -5 -> floor(0.5) = 0 -> -1.
  const at::Tensor z = torch::tensor({0.0f, 0.6f, -5.0f}).reshape({3, 1});
  EXPECT_TRUE(torch::equal(fsq.quantize_codes(z), torch::tensor({0.0f, 0.5f, -1.0f}).reshape({3, 1})));
}

TEST(Fsq, GradientIsStraightThroughTheBound) {
  Fsq fsq(FsqOptions({8, 5}));
  const at::Tensor z = torch::tensor({0.3, -1.2, 0.7, 2.0}, torch::kFloat32).reshape({2, 2}).requires_grad_();
  fsq.quantize_codes(z).sum().backward();
  // d/dz of tanh(z + shift) * half / floor(L / 2), the rounding contributing identity.
  const at::Tensor levels = torch::tensor({8.0f, 5.0f});
  const at::Tensor half = (levels - 1) * 1.001 / 2;
  const at::Tensor shift = (torch::tensor({0.5f, 0.0f}) / half).atanh();
  const at::Tensor t = (z.detach() + shift).tanh();
  const at::Tensor expected = (1 - t * t) * half / (levels / 2).floor();
  EXPECT_TRUE(torch::allclose(z.grad(), expected, 1e-5, 1e-6)) << z.grad() << expected;
}

TEST(Fsq, ProjectionsAndSeveralCodebooks) {
  Fsq fsq(FsqOptions({4, 4}).dim(10).num_codebooks(3));
  EXPECT_EQ(fsq.dim(), 10);
  EXPECT_EQ(fsq.codebook_size(), 16);
  const at::Tensor x = torch::randn({2, 7, 10}, torch::requires_grad());
  const QuantizerOutput out = fsq.quantize(x, {});
  EXPECT_EQ(out.quantized.sizes(), x.sizes());
  EXPECT_EQ(out.indices.sizes(), (std::vector<int64_t>{2, 7, 3}));
  EXPECT_TRUE(torch::allclose(fsq.decode(out.indices), out.quantized, 1e-5, 1e-6));
  out.quantized.sum().backward();
  EXPECT_GT(x.grad().abs().sum().item<float>(), 0.0f);
}

TEST(Fsq, InvalidOptionsNameTheValue) {
  try {
    Fsq fsq(FsqOptions({8, 1, 5}));
    FAIL() << "levels with a 1 were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("levels[1] = 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Fsq(FsqOptions({})), InvalidArgument);
  EXPECT_THROW(Fsq(FsqOptions({4}).num_codebooks(0)), InvalidArgument);
  EXPECT_THROW(Fsq(FsqOptions({256, 256, 256, 256, 2})), InvalidArgument);
}

TEST(Fsq, DecodeRejectsOutOfRangeIndicesAndWrongShapes) {
  Fsq fsq(FsqOptions({8, 5, 5, 5}));
  EXPECT_THROW(fsq.decode(torch::tensor({{1000}}, torch::kInt64)), InvalidArgument);
  EXPECT_THROW(fsq.decode(torch::tensor({{-1}}, torch::kInt64)), InvalidArgument);
  EXPECT_THROW(fsq.decode(torch::zeros({2}, torch::kInt64)), InvalidArgument);
  EXPECT_THROW(fsq.quantize(torch::randn({2, 3, 5}), {}), InvalidArgument);
}

TEST(QuantizerRegistry, BuildsByNameAndListsNamesForUnknownOnes) {
  OptionReader options;
  options.int_list = [](const std::string& key) {
    EXPECT_EQ(key, "levels");
    return std::vector<int64_t>{7, 5};
  };
  auto q = make_quantizer("fsq", options);
  EXPECT_EQ(q->kind(), "fsq");
  EXPECT_EQ(q->codebook_size(), 35);
  try {
    make_quantizer("vqq", options);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("valid: fsq"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::quant
