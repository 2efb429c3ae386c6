// The CUDA kernels of src/quant/cuda against the fused CPU kernels and the torch-op paths on the
// same inputs: indices equal where there is no near-tie, values within float32 rounding, exact
// ties to the lowest code, and the same statistics on every run. They run where a GPU is visible
// and the build has the kernels, and show as skipped elsewhere, saying why.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/kmeans.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/nearest_code.h"
#include "quant/cuda_kernels.h"
#include "quant/lfq_internal.h"
#include "quant/nearest_code_kernels.h"

namespace lockstep::quant {
namespace {

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!LOCKSTEP_HAVE_CUDA_KERNELS) GTEST_SKIP() << "this build has no CUDA kernels (no nvcc, or no CUDA LibTorch)";
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
    torch::manual_seed(41);
  }
  const torch::Device cuda{torch::kCUDA, 0};
};

// Where the kernel's index differs from the CPU's, its code must be as near as the CPU's (a near-tie
// rounded the other way), never a worse code.
void expect_same_search(const NearestCode& gpu, const NearestCode& cpu, const at::Tensor& x, const at::Tensor& codebook,
                        Metric metric) {
  const at::Tensor gi = gpu.indices.cpu();
  ASSERT_EQ(gi.sizes(), cpu.indices.sizes());
  const at::Tensor differ = (gi != cpu.indices).nonzero().flatten();
  EXPECT_LE(differ.numel(), std::max<int64_t>(2, x.size(0) / 500)) << "more than near-ties differ";
  for (int64_t r = 0; r < differ.numel(); ++r) {
    const int64_t t = differ[r].item<int64_t>();
    const at::Tensor chosen = codebook[gi[t].item<int64_t>()], best = codebook[cpu.indices[t].item<int64_t>()];
    const double a = metric == Metric::Euclidean ? (x[t] - chosen).square().sum().item<double>()
                                                 : -(x[t] * chosen).sum().item<double>();
    const double b =
        metric == Metric::Euclidean ? (x[t] - best).square().sum().item<double>() : -(x[t] * best).sum().item<double>();
    EXPECT_NEAR(a, b, 1e-4 * (std::abs(b) + 1)) << "token " << t;
  }
  EXPECT_TRUE(torch::allclose(gpu.score.cpu(), cpu.score, 1e-4, 1e-3));
}

TEST_F(CudaKernels, NearestCodeEqualsTheFusedKernelAcrossShapesAndSplits) {
  struct Shape {
    int64_t n, k, d;
  };
  // One token, one code; d not a multiple of the kernel's stage of 8; k over many splits; d 256.
  for (const Shape s : {Shape{1, 1, 8}, Shape{129, 3, 5}, Shape{5000, 1500, 32}, Shape{300, 20000, 8},
                        Shape{1000, 512, 256}, Shape{40000, 129, 16}}) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " d " + std::to_string(s.d));
    at::Tensor x = torch::randn({s.n, s.d}), codebook = torch::randn({s.k, s.d});
    for (Metric metric : {Metric::Euclidean, Metric::Cosine}) {
      if (metric == Metric::Cosine) {
        x = torch::nn::functional::normalize(x, torch::nn::functional::NormalizeFuncOptions().dim(1));
        codebook = torch::nn::functional::normalize(codebook, torch::nn::functional::NormalizeFuncOptions().dim(1));
      }
      const NearestCode cpu = nearest_code(x, codebook, metric);
      const NearestCode gpu = nearest_code(x.to(cuda), codebook.to(cuda), metric);
      ASSERT_TRUE(gpu.indices.is_cuda() && gpu.score.is_cuda());
      expect_same_search(gpu, cpu, x, codebook, metric);
      // The torch-op path on the same GPU agrees too (what ran there before the kernel).
      const NearestCode tiled = detail::nearest_code_with_kernel(x.to(cuda), codebook.to(cuda), metric, "tiled");
      expect_same_search(gpu, {tiled.indices.cpu(), tiled.score.cpu()}, x, codebook, metric);
    }
  }
}

TEST_F(CudaKernels, NearestCodeExactTiesGoToTheLowestCodeAndNanRowsToCodeZero) {
  // Codes 3000.. repeat codes 0.. exactly, in another split than the originals; tokens are copies of
  // codes of both halves, and one token is NaN.
  const at::Tensor half = torch::randn({3000, 16});
  const at::Tensor codebook = torch::cat({half, half});
  at::Tensor x = torch::cat({half.narrow(0, 0, 200), half.narrow(0, 2800, 200)}).clone();
  x[17].fill_(NAN);
  for (Metric metric : {Metric::Euclidean, Metric::Cosine}) {
    const NearestCode gpu = nearest_code(x.to(cuda), codebook.to(cuda), metric);
    const at::Tensor gi = gpu.indices.cpu();
    EXPECT_EQ(gi[17].item<int64_t>(), 0);
    EXPECT_TRUE((gi < 3000).all().item<bool>()) << "a copy beat the lower original";
    if (metric == Metric::Euclidean) {  // each token is its own code (cosine: unnormalised, any code may win)
      at::Tensor expected = torch::cat({torch::arange(0, 200), torch::arange(2800, 3000)});
      expected[17] = 0;
      EXPECT_TRUE(torch::equal(gi, expected));
    }
  }
}

// The top-k search ranks the values the kernel compares (issue #47): its first code and score are the
// kernel's nearest, bit for bit, with exact copies and near-copies of codes, over splits and d off the stage.
TEST_F(CudaKernels, NearestCodesStartWithTheKernelsNearestCode) {
  for (const auto& [n, k, d] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1024, 512, 256}, {3000, 1500, 13}, {129, 9, 5}}) {
    at::Tensor codebook = torch::randn({k, d});
    codebook.narrow(0, k / 2, k / 4).copy_(codebook.narrow(0, 0, k / 4) * (1 + 1e-6 * torch::randn({k / 4, d})));
    codebook[k - 1] = codebook[0];
    const at::Tensor pick = torch::randint(0, k / 4, {n});
    const at::Tensor x = (codebook.index_select(0, pick) + codebook.index_select(0, pick + k / 2)) / 2;
    for (Metric metric : {Metric::Euclidean, Metric::Cosine}) {
      SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k) + " d " + std::to_string(d));
      const NearestCode nearest = nearest_code(x.to(cuda), codebook.to(cuda), metric);
      const NearestCode top = nearest_codes(x.to(cuda), codebook.to(cuda), metric, std::min<int64_t>(k, 4));
      ASSERT_TRUE(top.indices.is_cuda());
      EXPECT_TRUE(torch::equal(top.indices.select(1, 0), nearest.indices));
      EXPECT_TRUE(torch::equal(top.score.select(1, 0), nearest.score));
      EXPECT_TRUE(torch::equal(code_scores(x.to(cuda), codebook.to(cuda), metric).argmin(1), nearest.indices));
    }
  }
}

TEST_F(CudaKernels, NearestCodeRefusesMismatchedInputsWithTheirShapes) {
  const at::Tensor x = torch::randn({10, 8}, cuda);
  EXPECT_THROW(detail::nearest_code_cuda(x, torch::randn({5, 7}, cuda), Metric::Euclidean), InvalidArgument);
  EXPECT_THROW(detail::nearest_code_cuda(x, torch::randn({0, 8}, cuda), Metric::Euclidean), InvalidArgument);
  EXPECT_THROW(detail::nearest_code_cuda(x.cpu(), torch::randn({5, 8}), Metric::Euclidean), InvalidArgument);
  EXPECT_EQ(nearest_code(torch::randn({0, 8}, cuda), torch::randn({5, 8}, cuda), Metric::Cosine).indices.numel(), 0);
}

// Every bound (tanh or hard clamp, default or symmetric), with and without noise: codes, indices,
// gradients and the noise's elements as the fused CPU kernel gives them.
TEST_F(CudaKernels, FsqForwardAndBackwardEqualTheFusedKernelForEveryBound) {
  for (const bool symmetric : {false, true}) {
    for (const bool hard_clamp : {false, true}) {
      for (const double noise : {0.0, 0.4}) {
        if (noise > 0 && !symmetric) continue;  // noise dropout needs the symmetric bound
        SCOPED_TRACE(std::string(symmetric ? "symmetric" : "default") + (hard_clamp ? " hard clamp" : " tanh") +
                     " noise " + std::to_string(noise));
        Fsq fsq(
            FsqOptions({8, 5, 5, 5, 3}).preserve_symmetry(symmetric).bound_hard_clamp(hard_clamp).noise_dropout(noise));
        const at::Tensor z = torch::randn({30000, 5}) * 1.5;
        const at::Tensor zc = z.clone().requires_grad_(), zg = z.to(cuda).requires_grad_();
        const FsqCodes cpu = fsq.quantize_and_index(zc, at::detail::createCPUGenerator(9), 12345);
        const FsqCodes gpu = fsq.quantize_and_index(zg, at::detail::createCPUGenerator(9), 12345);
        ASSERT_TRUE(gpu.codes.is_cuda() && gpu.indices.is_cuda());
        // tanh may differ by an ulp, which moves a value within ~1e-6 of a boundary to its neighbour.
        const double same_codes =
            (gpu.codes.detach().cpu() == cpu.codes.detach()).to(torch::kFloat64).mean().item<double>();
        const double same_indices = (gpu.indices.cpu() == cpu.indices).to(torch::kFloat64).mean().item<double>();
        EXPECT_GE(same_codes, 0.9999);
        EXPECT_GE(same_indices, 0.9995);
        if (noise == 0) {
          EXPECT_TRUE(torch::equal(fsq.codes_to_indices(gpu.codes.detach()).cpu(), gpu.indices.cpu()));
        }
        const at::Tensor w = torch::randn_like(z);
        (cpu.codes * w).sum().backward();
        (gpu.codes * w.to(cuda)).sum().backward();
        EXPECT_TRUE(torch::allclose(zg.grad().cpu(), zc.grad(), 1e-5, 1e-6));
      }
    }
  }
}

TEST_F(CudaKernels, FsqWithoutGradientAndWithManyLevelsEqualsTheCpu) {
  Fsq fsq(FsqOptions({2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));  // 20 levels, K = 2^20
  const at::Tensor z = torch::randn({3, 777, 20});
  const torch::NoGradGuard no_grad;
  const FsqCodes cpu = fsq.quantize_and_index(z), gpu = fsq.quantize_and_index(z.to(cuda));
  EXPECT_EQ(gpu.indices.sizes(), cpu.indices.sizes());
  EXPECT_GE((gpu.indices.cpu() == cpu.indices).to(torch::kFloat64).mean().item<double>(), 0.999);
}

// Counts and float64 sums equal the CPU loop's bit for bit (the same additions in the same order),
// on every run; with most tokens on one code, with empty codes, and with several codebooks.
// smallest_first's top-k kernel ranks as the CPU does, exactly (the same values): ties, NaN, infinities,
// every list width, long rows, half precision; k > 32 and float64 keep the sort, with the same result.
TEST_F(CudaKernels, SmallestFirstOnTheDeviceRanksAsTheCpu) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const int64_t m : {1, 40, 1000, 70000}) {
    at::Tensor values = torch::randint(0, 50, {300, m}).to(torch::kFloat32);
    values.masked_fill_(torch::rand({300, m}) < 0.01, nan);
    values.masked_fill_(torch::rand({300, m}) < 0.01, inf);
    values.masked_fill_(torch::rand({300, m}) < 0.01, -inf);
    for (const int64_t k : {1, 3, 4, 8, 13, 16, 32, 33}) {
      if (k > m) continue;
      const at::Tensor cpu = smallest_first(values, k);
      EXPECT_TRUE(torch::equal(smallest_first(values.to(cuda), k).cpu(), cpu)) << "m " << m << ", k " << k;
      EXPECT_TRUE(torch::equal(smallest_first(values.to(cuda).to(torch::kFloat16), k).cpu(),
                               smallest_first(values.to(torch::kFloat16).to(torch::kFloat32), k)))
          << "half, m " << m << ", k " << k;
    }
    EXPECT_TRUE(torch::equal(smallest_first(values.to(torch::kFloat64).to(cuda), 1).cpu(), smallest_first(values, 1)));
  }
  const at::Tensor big = torch::tensor({{int64_t{1} << 40, (int64_t{1} << 40) - 1, int64_t{0}}});
  EXPECT_TRUE(torch::equal(smallest_first(big.to(cuda), 3).cpu(), torch::tensor({{2, 1, 0}}))) << "integers: the sort";
  EXPECT_THROW(detail::smallest_first_cuda(torch::zeros({2, 40}, torch::kFloat32).to(cuda), 33), InvalidArgument);
}

// LFQ's codebook-entropy sum through the kernels (lfq_halves_cuda and its backward) equals the torch-op
// path's on the same device, value and gradient, for one bit up to 2^18 codes and across chunks.
TEST_F(CudaKernels, LfqSumProbsAndItsGradientEqualTheTorchOps) {
  for (const auto& [bits, n, budget] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 37, int64_t{64} << 20}, {10, 300, int64_t{64} << 20}, {10, 300, 4096}, {18, 64, int64_t{1} << 20}}) {
    const at::Tensor x = (torch::randn({2, n, bits}) * 0.8).to(cuda);
    const at::Tensor g = torch::randn({2, int64_t{1} << bits}).to(cuda);
    const at::Tensor xk = x.clone().requires_grad_(), xo = x.clone().requires_grad_();
    const at::Tensor kernels = lfq_sum_probs(xk, 0.9, 1.0, budget),
                     ops = detail::lfq_sum_probs_ops(xo, 0.9, 1.0, budget);
    (kernels * g).sum().backward();
    (ops * g).sum().backward();
    EXPECT_TRUE(torch::allclose(kernels.cpu(), ops.cpu(), 1e-5, 1e-6)) << bits << " bits, budget " << budget;
    EXPECT_TRUE(torch::allclose(xk.grad().cpu(), xo.grad().cpu(), 1e-4, 1e-5)) << bits << " bits, budget " << budget;
    EXPECT_NEAR(kernels.sum().item<double>(), 2.0 * n, 1e-3 * n) << "each token's probabilities sum to 1";
  }
}

// LFQ's per-sample entropy through its kernels equals the torch operations on the same device, value and
// gradient, from one bit to 18.
TEST_F(CudaKernels, LfqPerSampleEntropyAndItsGradientEqualTheTorchOps) {
  for (const int64_t bits : {1, 10, 18}) {
    const at::Tensor x = (torch::randn({1000, bits}) * 2).to(cuda);
    const at::Tensor xk = x.clone().requires_grad_(), xo = x.clone().requires_grad_();
    const at::Tensor kernels = lfq_per_sample_entropy(xk, 0.9, 1.0),
                     ops = detail::lfq_per_sample_entropy_ops(xo, 0.9, 1.0);
    (kernels * 3).backward();
    (ops * 3).backward();
    EXPECT_NEAR(kernels.item<double>(), ops.item<double>(), 1e-5 * bits) << bits << " bits";
    EXPECT_TRUE(torch::allclose(xk.grad().cpu(), xo.grad().cpu(), 1e-4, 1e-7)) << bits << " bits";
  }
}

TEST_F(CudaKernels, CodeStatisticsEqualTheCpuBitForBitOnEveryRun) {
  const at::Tensor tokens = torch::randn({3, 20000, 24});
  at::Tensor indices = torch::randint(0, 300, {3, 20000}, torch::kInt64);
  indices.narrow(1, 0, 15000).fill_(7);  // one code takes most tokens
  const auto cpu = code_counts_and_sums(tokens, indices, 1000);
  const auto first = code_counts_and_sums(tokens.to(cuda), indices.to(cuda), 1000);
  const auto second = code_counts_and_sums(tokens.to(cuda), indices.to(cuda), 1000);
  ASSERT_TRUE(first[0].is_cuda() && first[1].is_cuda());
  EXPECT_EQ(first[1].scalar_type(), torch::kFloat64);
  EXPECT_TRUE(torch::equal(first[0].cpu(), cpu[0]));
  EXPECT_TRUE(torch::equal(first[1].cpu(), cpu[1]));
  EXPECT_TRUE(torch::equal(first[1], second[1]));
  EXPECT_THROW(code_counts_and_sums(tokens.to(cuda), (indices + 1000).to(cuda), 1000), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::quant
