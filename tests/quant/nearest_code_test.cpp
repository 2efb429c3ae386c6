#include "lockstep/quant/nearest_code.h"
#include "quant/nearest_code_kernels.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {

// Brute force with the full distance matrix: what nearest_code must agree with.
std::tuple<at::Tensor, at::Tensor> brute_force(const at::Tensor& x, const at::Tensor& codebook, Metric metric) {
  if (metric == Metric::Cosine) {
    const at::Tensor sim = x.mm(codebook.t());
    auto [score, idx] = sim.max(1);
    return {idx, score};
  }
  const at::Tensor dist = torch::cdist(x.to(torch::kFloat64), codebook.to(torch::kFloat64)).pow(2);
  auto [score, idx] = dist.min(1);
  return {idx, score.to(torch::kFloat32)};
}

// Random tokens and codes (unit length for Cosine).
std::tuple<at::Tensor, at::Tensor> random_inputs(int64_t n, int64_t k, int64_t d, Metric metric) {
  torch::manual_seed(n * 1000 + k * 10 + d);
  at::Tensor x = torch::randn({n, d});
  at::Tensor codebook = torch::randn({k, d});
  if (metric == Metric::Cosine) {
    x = torch::nn::functional::normalize(x, torch::nn::functional::NormalizeFuncOptions().dim(1));
    codebook = torch::nn::functional::normalize(codebook, torch::nn::functional::NormalizeFuncOptions().dim(1));
  }
  return {x, codebook};
}

void expect_equals_brute_force(const at::Tensor& x, const at::Tensor& codebook, Metric metric, const NearestCode& got) {
  const int64_t n = x.size(0), k = codebook.size(0), d = x.size(1);
  ASSERT_EQ(got.indices.sizes(), (std::vector<int64_t>{n}));
  ASSERT_EQ(got.indices.scalar_type(), torch::kInt64);
  ASSERT_EQ(got.score.sizes(), (std::vector<int64_t>{n}));
  const auto [idx, score] = brute_force(x, codebook, metric);
  EXPECT_TRUE(torch::allclose(got.score, score, 1e-4, 1e-4));
  // Where the indices differ (float32 rounding on a near-tie), the chosen code must be as good as
  // the brute-force one. With d > 1 near-ties are rare; with d = 1 and many codes they are common.
  const at::Tensor differ = got.indices != idx;
  if (d > 1) {
    EXPECT_LE(differ.sum().item<int64_t>(), std::max<int64_t>(1, n / 1000)) << "n=" << n << " k=" << k << " d=" << d;
  }
  if (differ.any().item<bool>()) {
    const at::Tensor rows = differ.nonzero().squeeze(1);
    const at::Tensor a =
        (x.index_select(0, rows) - codebook.index_select(0, got.indices.index_select(0, rows))).pow(2).sum(1);
    const at::Tensor b = (x.index_select(0, rows) - codebook.index_select(0, idx.index_select(0, rows))).pow(2).sum(1);
    EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-4));
  }
}

class NearestCodeSizes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, Metric>> {};

TEST_P(NearestCodeSizes, EqualsBruteForce) {
  const auto [n, k, d, metric] = GetParam();
  const auto [x, codebook] = random_inputs(n, k, d, metric);
  expect_equals_brute_force(x, codebook, metric, nearest_code(x, codebook, metric));
}

INSTANTIATE_TEST_SUITE_P(Sizes, NearestCodeSizes,
                         ::testing::Combine(::testing::Values<int64_t>(0, 1, 7, 257, 1000, 2100),
                                            ::testing::Values<int64_t>(1, 3, 511, 512, 513, 1300),
                                            ::testing::Values<int64_t>(1, 5, 64),
                                            ::testing::Values(Metric::Euclidean, Metric::Cosine)));

TEST(NearestCode, ExactTiesGoToTheLowestIndex) {
  torch::manual_seed(3);
  // Codes 2 and 700 (different code tiles) and 5 are copies of code 1; tokens equal to code 1.
  at::Tensor codebook = torch::randn({1100, 8});
  for (int64_t copy : {2, 5, 700}) codebook[copy] = codebook[1];
  const at::Tensor x = codebook[1].unsqueeze(0).repeat({600, 1});
  for (Metric metric : {Metric::Euclidean, Metric::Cosine}) {
    at::Tensor cb = codebook;
    at::Tensor xs = x;
    if (metric == Metric::Cosine) {
      cb = codebook / codebook.norm(2, 1, true);
      xs = x / x.norm(2, 1, true);
    }
    const NearestCode got = nearest_code(xs, cb, metric);
    EXPECT_TRUE((got.indices == 1).all().item<bool>()) << std::get<0>(at::_unique(got.indices));
  }
  // All codes equal: index 0 everywhere.
  const NearestCode same = nearest_code(torch::randn({300, 4}), torch::ones({600, 4}), Metric::Euclidean);
  EXPECT_TRUE((same.indices == 0).all().item<bool>());
}

TEST(NearestCode, RejectsMismatchedShapesAndEmptyCodebooks) {
  EXPECT_THROW(nearest_code(torch::randn({3, 4}), torch::randn({5, 3}), Metric::Euclidean), InvalidArgument);
  EXPECT_THROW(nearest_code(torch::randn({3, 4}), torch::randn({0, 4}), Metric::Euclidean), InvalidArgument);
  EXPECT_THROW(nearest_code(torch::randn({3}), torch::randn({5, 3}), Metric::Euclidean), InvalidArgument);
}

TEST(NearestCode, AcceptsTensorsThatRequireGradAndNonContiguousInputs) {
  const at::Tensor x = torch::randn({40, 6}, torch::requires_grad());
  const at::Tensor codebook = torch::randn({6, 30}).t();  // (30, 6), transposed view
  const NearestCode got = nearest_code(x, codebook, Metric::Euclidean);
  const auto [idx, score] = brute_force(x.detach(), codebook.contiguous(), Metric::Euclidean);
  EXPECT_TRUE(torch::equal(got.indices, idx));
}

TEST(NearestCode, SeveralThreadsGiveTheSameAnswer) {
  torch::manual_seed(9);
  const at::Tensor x = torch::randn({5000, 16});
  const at::Tensor codebook = torch::randn({300, 16});
  const NearestCode one = nearest_code(x, codebook, Metric::Euclidean);
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const NearestCode two = nearest_code(x, codebook, Metric::Euclidean);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.indices, two.indices));
  EXPECT_TRUE(torch::equal(one.score, two.score));
}

// Every kernel the CPU can run (nearest_code uses the first), on sizes around its row block (4, 6,
// 8 or 12 tokens) and code block (8, 16 or 32 codes): fewer tokens or codes than one block, one
// more or one less than a block, odd d.
bool kernel_available(const std::string& kernel) {
  if (kernel == "tiled") return true;  // torch operations: runs on any device
  const std::vector<std::string> all = detail::nearest_code_kernels();
  return std::find(all.begin(), all.end(), kernel) != all.end();
}

TEST(NearestCodeKernels, GenericIsAlwaysThereAndUnknownNamesAreRejected) {
  const std::vector<std::string> all = detail::nearest_code_kernels();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back(), "generic");
  EXPECT_THROW(detail::nearest_code_with_kernel(torch::randn({3, 4}), torch::randn({5, 4}), Metric::Euclidean, "nope"),
               InvalidArgument);
  // nearest_code runs the first kernel.
  const auto [x, codebook] = random_inputs(100, 70, 9, Metric::Euclidean);
  const NearestCode a = nearest_code(x, codebook, Metric::Euclidean);
  const NearestCode b = detail::nearest_code_with_kernel(x, codebook, Metric::Euclidean, all.front());
  EXPECT_TRUE(torch::equal(a.indices, b.indices));
  EXPECT_TRUE(torch::equal(a.score, b.score));
}

// Every kernel against brute force over sizes around its register blocks (12 tokens x 32 codes on
// AVX-512): one test per kernel looping over the sizes, so ctest starts 3 processes, not 500.
class NearestCodeKernelSizes : public ::testing::TestWithParam<std::string> {};

TEST_P(NearestCodeKernelSizes, EqualsBruteForce) {
  const std::string kernel = GetParam();
  if (!kernel_available(kernel)) GTEST_SKIP() << kernel << " does not run on this CPU";
  for (int64_t n : {0, 1, 5, 12, 13, 25, 300}) {
    for (int64_t k : {1, 7, 9, 17, 31, 32, 33, 100}) {
      for (int64_t d : {1, 3, 64}) {
        for (Metric metric : {Metric::Euclidean, Metric::Cosine}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << ", k " << k << ", d " << d << ", "
                                            << (metric == Metric::Euclidean ? "Euclidean" : "Cosine"));
          const auto [x, codebook] = random_inputs(n, k, d, metric);
          expect_equals_brute_force(x, codebook, metric, detail::nearest_code_with_kernel(x, codebook, metric, kernel));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, NearestCodeKernelSizes,
                         ::testing::Values(std::string("avx512"), std::string("avx2"), std::string("generic"),
                                           std::string("tiled")));

class NearestCodeKernel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!kernel_available(GetParam())) GTEST_SKIP() << GetParam() << " does not run on this CPU";
  }
};

TEST_P(NearestCodeKernel, ExactTiesGoToTheLowestIndex) {
  // Copies of code 1 in the same code block (2, 5), another block (40) and far away (700).
  at::Tensor codebook = torch::randn({1100, 8});
  for (int64_t copy : {2, 5, 40, 700}) codebook[copy] = codebook[1];
  const at::Tensor x = codebook[1].unsqueeze(0).repeat({37, 1});
  for (Metric metric : {Metric::Euclidean, Metric::Cosine}) {
    const at::Tensor cb = metric == Metric::Cosine ? codebook / codebook.norm(2, 1, true) : codebook;
    const at::Tensor xs = metric == Metric::Cosine ? x / x.norm(2, 1, true) : x;
    const NearestCode got = detail::nearest_code_with_kernel(xs, cb, metric, GetParam());
    EXPECT_TRUE((got.indices == 1).all().item<bool>()) << std::get<0>(at::_unique(got.indices));
  }
  for (int64_t k : {1, 3, 33, 600}) {
    const NearestCode same =
        detail::nearest_code_with_kernel(torch::randn({29, 4}), torch::ones({k, 4}), Metric::Euclidean, GetParam());
    EXPECT_TRUE((same.indices == 0).all().item<bool>()) << "k=" << k;
  }
}

TEST_P(NearestCodeKernel, InfiniteDistancesGiveValidIndices) {
  // Every distance overflows to +inf: index 0, never a padding lane past k.
  const at::Tensor x = torch::full({5, 3}, 3e38f);
  const NearestCode got = detail::nearest_code_with_kernel(x, -x.narrow(0, 0, 3), Metric::Euclidean, GetParam());
  EXPECT_TRUE((got.indices == 0).all().item<bool>()) << got.indices;
}

TEST_P(NearestCodeKernel, SeveralThreadsGiveTheSameAnswer) {
  // 4999 rows: the per-thread chunks end off the kernel's row blocks.
  const auto [x, codebook] = random_inputs(4999, 300, 16, Metric::Euclidean);
  const NearestCode one = detail::nearest_code_with_kernel(x, codebook, Metric::Euclidean, GetParam());
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const NearestCode two = detail::nearest_code_with_kernel(x, codebook, Metric::Euclidean, GetParam());
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.indices, two.indices));
  EXPECT_TRUE(torch::equal(one.score, two.score));
  expect_equals_brute_force(x, codebook, Metric::Euclidean, two);
}

// The fused kernels only: the tiled search gives neither of these two guarantees (see below).
INSTANTIATE_TEST_SUITE_P(Kernels, NearestCodeKernel,
                         ::testing::Values(std::string("avx512"), std::string("avx2"), std::string("generic")));

// The device-independent search (what CUDA runs) against the fused CPU kernel, with tiles small
// enough that tokens and codes span many tiles. Its scores come from a BLAS matrix product, whose
// rounding of one dot product may depend on the column's place and on the thread count (OpenBLAS:
// both, seen here), so an exact copy of a code can win a tie (an equally near code) and results
// are not bitwise thread-invariant; elsewhere indices differ only on near-ties, and scores agree.
TEST(NearestCodeTiled, MatchesTheFusedKernelAcrossTiles) {
  for (Metric metric : {Metric::Euclidean, Metric::Cosine}) {
    auto [x, codebook] = random_inputs(3001, 700, 12, metric);
    for (int64_t copy : {64, 65, 600}) codebook[copy] = codebook[3];
    x.narrow(0, 0, 50).copy_(codebook[3].unsqueeze(0).expand({50, 12}));
    const NearestCode fused = nearest_code(x, codebook, metric);
    const auto [exact, exact_score] = brute_force(x, codebook, metric);
    for (auto [tokens, codes] : {std::pair<int64_t, int64_t>{64, 64}, {1000, 7}, {5000, 5000}}) {
      SCOPED_TRACE(::testing::Message() << "tiles " << tokens << " x " << codes);
      const NearestCode tiled = detail::nearest_code_tiled(x, codebook, metric, tokens, codes);
      const at::Tensor dup = tiled.indices.narrow(0, 0, 50);
      EXPECT_TRUE((dup == 3).logical_or(dup == 64).logical_or(dup == 65).logical_or(dup == 600).all().item<bool>());
      const at::Tensor rest = tiled.indices.narrow(0, 50, 2951), rest_fused = fused.indices.narrow(0, 50, 2951);
      EXPECT_LE((rest != rest_fused).sum().item<int64_t>(), 10);  // near-ties: 0-4 seen
      EXPECT_TRUE(torch::allclose(tiled.score, fused.score, 1e-4, 1e-4)) << (tiled.score - fused.score).abs().max();
      EXPECT_TRUE(torch::allclose(tiled.score, exact_score, 1e-4, 1e-4));
    }
  }
  // Every distance overflowing to +inf still gives a valid index (0).
  const at::Tensor huge = torch::full({5, 3}, 3e38f);
  EXPECT_TRUE((detail::nearest_code_tiled(huge, -huge.narrow(0, 0, 3), Metric::Euclidean, 2, 2).indices == 0)
                  .all()
                  .item<bool>());
  EXPECT_THROW(detail::nearest_code_tiled(torch::randn({3, 4}), torch::randn({5, 4}), Metric::Euclidean, 0, 8),
               InvalidArgument);
}

}  // namespace
}  // namespace lockstep::quant
