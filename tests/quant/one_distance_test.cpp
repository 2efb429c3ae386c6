// Issue #47 item 4: every path that picks codes (the nearest search, top-k, sampled codes, k-means'
// assignment, beam search) ranks one distance, so the first of a top-k is the nearest code bit for
// bit. The inputs are built to tie: exact copies of codes, near-copies a few ulps away, and tokens
// halfway between two codes (equidistant up to rounding).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/quant/kmeans.h"
#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/vq.h"
#include "quant/nearest_code_kernels.h"
#include "quant/smallest_k.h"
#include "seeded.h"

namespace lockstep::quant {
namespace {

using test_util::seeded;

at::Tensor unit(const at::Tensor& t) {
  return torch::nn::functional::normalize(t, torch::nn::functional::NormalizeFuncOptions().dim(-1));
}

// k codes in eighths: random; near-copies of the first eighth scaled by 1 + 1e-6 noise; shifted by
// 1e-6 noise; exact copies of the first half-eighth, then random. n tokens in quarters: halfway
// between a code and its near-copy; halfway between two random codes; a code plus 1e-3 noise;
// random. Unit length for Cosine.
std::pair<at::Tensor, at::Tensor> near_ties(uint64_t seed, int64_t n, int64_t k, int64_t d, Metric metric) {
  at::Generator g = seeded(seed);
  at::Tensor codes = torch::randn({k, d}, g);
  const int64_t e = k / 8;
  codes.narrow(0, e, e).copy_(codes.narrow(0, 0, e) * (1 + 1e-6 * torch::randn({e, d}, g)));
  codes.narrow(0, 2 * e, e).copy_(codes.narrow(0, 0, e) + 1e-6 * torch::randn({e, d}, g));
  codes.narrow(0, 3 * e, e / 2).copy_(codes.narrow(0, 0, e / 2));
  if (metric == Metric::Cosine) codes = unit(codes);
  const int64_t q = n / 4;
  const at::Tensor a = torch::randint(0, e, {q}, g);
  const at::Tensor b = torch::randint(0, k, {q}, g), c = torch::randint(0, k, {q}, g);
  const at::Tensor near = torch::randint(0, k, {q}, g);
  at::Tensor x =
      torch::cat({(codes.index_select(0, a) + codes.index_select(0, a + e)) / 2,
                  (codes.index_select(0, b) + codes.index_select(0, c)) / 2,
                  codes.index_select(0, near) + 1e-3 * torch::randn({q, d}, g), torch::randn({n - 3 * q, d}, g)});
  if (metric == Metric::Cosine) x = unit(x);
  return {x, codes};
}

std::string name(Metric metric) { return metric == Metric::Euclidean ? "euclidean" : "cosine"; }

class OneDistance : public ::testing::TestWithParam<Metric> {};

// nearest_codes' first column is nearest_code's index and score, bit for bit, over 30 seeds of the
// issue's shape; its columns follow code_scores (non-decreasing), whose first smallest is the index.
TEST_P(OneDistance, TheFirstOfTopkIsTheNearestCode) {
  const Metric metric = GetParam();
  for (uint64_t seed = 0; seed < 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto [x, codes] = near_ties(seed, 1024, 512, 256, metric);
    const NearestCode nearest = nearest_code(x, codes, metric);
    const NearestCode top = nearest_codes(x, codes, metric, 5);
    ASSERT_EQ(top.indices.sizes(), (std::vector<int64_t>{1024, 5}));
    EXPECT_EQ((top.indices.select(1, 0) != nearest.indices).sum().item<int64_t>(), 0);
    EXPECT_TRUE(torch::equal(top.score.select(1, 0), nearest.score));
    const at::Tensor values = code_scores(x, codes, metric);
    EXPECT_TRUE(torch::equal(values.argmin(1), nearest.indices));  // argmin: the first of the smallest
    const at::Tensor ranked = values.gather(1, top.indices);
    EXPECT_TRUE((ranked.narrow(1, 1, 4) >= ranked.narrow(1, 0, 4)).all().item<bool>());
  }
}

// Every kernel nearest_code_with_kernel runs here (the fused ones this CPU has, and the tiled one
// from torch operations): its top-k starts with its own nearest code, on sizes off its blocks too.
TEST_P(OneDistance, EveryKernelsTopkStartsWithItsNearestCode) {
  const Metric metric = GetParam();
  std::vector<std::string> kernels = detail::nearest_code_kernels();
  kernels.emplace_back("tiled");
  for (const std::string& kernel : kernels) {
    for (const auto& [n, k, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1024, 512, 256}, {301, 37, 5}, {2500, 64, 16}, {13, 9, 1}}) {
      for (uint64_t seed = 0; seed < 4; ++seed) {
        SCOPED_TRACE(kernel + ", n " + std::to_string(n) + ", k " + std::to_string(k) + ", d " + std::to_string(d) +
                     ", seed " + std::to_string(seed));
        const auto [x, codes] = near_ties(seed, n, k, d, metric);
        const NearestCode nearest = detail::nearest_code_with_kernel(x, codes, metric, kernel);
        const NearestCode top = detail::nearest_codes_with_kernel(x, codes, metric, std::min<int64_t>(3, k), kernel);
        EXPECT_TRUE(torch::equal(top.indices.select(1, 0), nearest.indices));
        EXPECT_TRUE(torch::equal(top.score.select(1, 0), nearest.score));
      }
    }
  }
}

// Exact copies of a code: the top-k lists them in index order, the nearest first, as argmin would.
TEST_P(OneDistance, CopiesOfACodeRankInIndexOrder) {
  const Metric metric = GetParam();
  at::Tensor codes = torch::randn({600, 8}, seeded(3));
  for (int64_t copy : {2, 5, 40, 599}) codes[copy] = codes[1];
  if (metric == Metric::Cosine) codes = unit(codes);
  const at::Tensor x = codes[1].unsqueeze(0).repeat({50, 1});
  const NearestCode top = nearest_codes(x, codes, metric, 5);
  EXPECT_TRUE(torch::equal(top.indices, torch::tensor({1, 2, 5, 40, 599}).repeat({50, 1}))) << top.indices[0];
  // Every value +inf or NaN: index 0 first, as the fused search gives.
  const at::Tensor huge = torch::full({4, 3}, 3e38f);
  EXPECT_TRUE(
      (nearest_codes(huge, -huge.narrow(0, 0, 3), Metric::Euclidean, 2).indices.select(1, 0) == 0).all().item<bool>());
}

// smallest_first: equal values by index, NaN after every number (as +inf, by index among those).
TEST(OneDistanceOrder, SmallestFirstKeepsIndexOrderOnTiesAndRanksNanAsInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const at::Tensor values = torch::tensor({{3.0f, 1.0f, 1.0f, nan, 0.5f, inf}, {nan, 2.0f, nan, 2.0f, -inf, inf}});
  EXPECT_TRUE(torch::equal(smallest_first(values, 6), torch::tensor({{4, 1, 2, 0, 3, 5}, {4, 1, 3, 0, 2, 5}})))
      << smallest_first(values, 6);
  EXPECT_TRUE(torch::equal(smallest_first(values, 1), torch::tensor({{4}, {4}})));
  EXPECT_TRUE(torch::equal(smallest_first(values.to(torch::kFloat64), 3), torch::tensor({{4, 1, 2}, {4, 1, 3}})));
  // Integers keep their order where float32 would round them into a tie (2^40 and 2^40 - 1).
  const at::Tensor big = torch::tensor({{int64_t{1} << 40, (int64_t{1} << 40) - 1, int64_t{0}}});
  EXPECT_TRUE(torch::equal(smallest_first(big, 3), torch::tensor({{2, 1, 0}}))) << smallest_first(big, 3);
  EXPECT_THROW(smallest_first(values, 7), InvalidArgument);
  EXPECT_THROW(smallest_first(values, 0), InvalidArgument);
}

// The CUDA top-k kernel's algorithm (smallest_k.h: per-lane lists, then a merge of their heads), run lane
// by lane on the CPU, gives smallest_first's columns: values drawn from few levels (so many ties), NaN and
// +-inf among them, every list width, rows shorter than the lanes and rows many times longer.
template <int W>
void expect_lanes_rank_as_smallest_first(const at::Tensor& values, int k, int lanes) {
  const at::Tensor expected = smallest_first(values, k);
  std::vector<int64_t> got(static_cast<size_t>(k));
  for (int64_t r = 0; r < values.size(0); ++r) {
    const at::Tensor row = values[r].contiguous();
    smallest_k::by_lanes<W>(row.data_ptr<float>(), row.numel(), k, lanes, got.data());
    ASSERT_TRUE(torch::equal(torch::tensor(got), expected[r]))
        << "k " << k << ", width " << W << ", " << lanes << " lanes, row " << row;
  }
}

TEST(OneDistanceOrder, TheTopkKernelsListsAndMergeRankAsSmallestFirst) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  at::Generator g = seeded(17);
  for (const int64_t m : {1, 5, 31, 33, 200, 1500}) {
    at::Tensor values = torch::randint(0, 7, {6, m}, g).to(torch::kFloat32);
    values.masked_fill_(torch::rand({6, m}, g) < 0.05, nan);
    values.masked_fill_(torch::rand({6, m}, g) < 0.05, inf);
    values.masked_fill_(torch::rand({6, m}, g) < 0.02, -inf);
    if (m > 1) values[0].fill_(nan);  // a row of NaN only: columns in order
    for (const int k : {1, 2, 4, 5, 8, 9, 16, 17, 32}) {
      if (k > m) continue;
      for (const int lanes : {32, 7, 1}) {
        smallest_k::with_list_width(k, [&](auto width) {
          static_assert(decltype(width)::value >= 1);
          ASSERT_GE(decltype(width)::value, k);
          expect_lanes_rank_as_smallest_first<decltype(width)::value>(values, k, lanes);
        });
      }
      // A list wider than k (a kernel instance serves every k up to its width) ranks the same.
      expect_lanes_rank_as_smallest_first<32>(values, k, 32);
      // The sort other devices take (and CUDA's float64 and k > 32) ranks the same.
      EXPECT_TRUE(torch::equal(detail::smallest_first_sorted(values, k), smallest_first(values, k))) << m << ", " << k;
    }
  }
}

// Vq end to end, the case: quantize_topk's first code is quantize's (encode's) for every
// token, and the same with stochastic_sample_codes in training: the top-k of the draws starts with
// the one code quantize draws with the same generator.
TEST_P(OneDistance, VqTopOneIsItsQuantizeCode) {
  const bool cosine = GetParam() == Metric::Cosine;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto [x, codes] = near_ties(seed, 1024, 512, 256, GetParam());
    Vq vq(VqOptions(256, 512).use_cosine_sim(cosine), seeded(seed));
    {
      torch::NoGradGuard no_grad;
      vq.named_buffers()["embed"].copy_(codes.unsqueeze(0));
    }
    vq.eval();
    const at::Tensor tokens = x.unsqueeze(0);
    const VqTopk top = vq.quantize_topk(tokens, 4, {});
    const at::Tensor nearest = vq.encode(tokens);
    EXPECT_EQ((top.indices.select(2, 0) != nearest).sum().item<int64_t>(), 0);
    EXPECT_TRUE(torch::equal(vq.quantize(tokens, {}).indices, nearest));
  }
}

TEST_P(OneDistance, VqSampledTopOneIsItsSampledCode) {
  const bool cosine = GetParam() == Metric::Cosine;
  const auto [x, codes] = near_ties(5, 1024, 512, 256, GetParam());
  const auto make = [&] {
    Vq vq(VqOptions(256, 512).use_cosine_sim(cosine).stochastic_sample_codes(true).sample_codebook_temp(0.01),
          seeded(1));
    torch::NoGradGuard no_grad;
    vq.named_buffers()["embed"].copy_(codes.unsqueeze(0));
    return vq;
  };
  for (uint64_t seed = 0; seed < 5; ++seed) {
    Vq a = make(), b = make();
    const at::Tensor drawn = a.quantize(x.unsqueeze(0), {nullptr, seeded(seed)}).indices;
    const VqTopk top = b.quantize_topk(x.unsqueeze(0), 3, {nullptr, seeded(seed)});
    EXPECT_TRUE(torch::equal(top.indices.select(2, 0), drawn)) << "seed " << seed;
  }
}

// k-means assigns each token the nearest search's code, the first of its top-k: one round from
// means that tie (copies and near-copies) counts exactly the top-1 indices.
TEST_P(OneDistance, KmeansAssignsTheFirstOfTheTopk) {
  const Metric metric = GetParam();
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const auto [x, codes] = near_ties(seed, 1024, 64, 32, metric);
    LocalReducer reducer;
    const KmeansResult result = kmeans(x.unsqueeze(0), codes.unsqueeze(0), 1, metric, reducer);
    const at::Tensor first = nearest_codes(x, codes, metric, 2).indices.select(1, 0);
    const at::Tensor counts = torch::bincount(first, {}, 64).to(torch::kFloat32);
    EXPECT_TRUE(torch::equal(result.counts[0], counts)) << "seed " << seed;
  }
}

// A beam search scores paths by the distances its layers' searches ranked: over one layer, a beam of
// any width chooses the nearest code (a beam of 1, the greedy search), ties and near-ties included.
TEST_P(OneDistance, BeamSearchOverOneLayerChoosesTheNearestCode) {
  const bool cosine = GetParam() == Metric::Cosine;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto [x, codes] = near_ties(seed, 1024, 128, 32, GetParam());
    auto rvq = make_residual_vq(ResidualOptions(1), VqOptions(32, 128).use_cosine_sim(cosine), seeded(seed));
    {
      torch::NoGradGuard no_grad;
      rvq->layers()[0]->named_buffers()["embed"].copy_(codes.unsqueeze(0));
    }
    rvq->eval();
    const at::Tensor tokens = x.unsqueeze(0);
    const at::Tensor greedy = rvq->quantize_beam(tokens, {}, 1).indices;
    EXPECT_TRUE(torch::equal(greedy.select(2, 0), rvq->layers()[0]->encode(tokens)));
    for (int64_t beam : {2, 4}) {
      EXPECT_EQ((rvq->quantize_beam(tokens, {}, beam).indices != greedy).sum().item<int64_t>(), 0) << "beam " << beam;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Metrics, OneDistance, ::testing::Values(Metric::Euclidean, Metric::Cosine),
                         [](const ::testing::TestParamInfo<Metric>& info) { return name(info.param); });

}  // namespace
}  // namespace lockstep::quant
