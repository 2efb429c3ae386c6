#include "lockstep/quant/lfq.h"
#include "lockstep/core/random.h"
#include "quant/lfq_halves.h"
#include "quant/lfq_internal.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <tuple>

#include "lockstep/core/error.h"
#include "lockstep/quant/registry.h"

namespace lockstep::quant {
namespace {

// The reference's definition with the explicit (n, K) softmax: what the factorised and chunked
// computations must agree with.
struct BruteForce {
  at::Tensor per_sample_clamped;  // mean_t -sum_c p log(max(p, 1e-5))
  at::Tensor per_sample_exact;    // mean_t -sum_c p log p
  at::Tensor codebook;            // H(mean_t p_t), clamped
  at::Tensor min_prob;
};

BruteForce brute_force(const at::Tensor& tokens, const at::Tensor& codebook, double inv_t) {
  const at::Tensor logits = torch::matmul(tokens, codebook.t().to(tokens.scalar_type())) * (2 * inv_t);
  const at::Tensor p = logits.softmax(-1);
  const at::Tensor avg = p.mean(0);
  return {-(p * p.clamp_min(1e-5).log()).sum(-1).mean(), -(p * logits.log_softmax(-1)).sum(-1).mean(),
          -(avg * avg.clamp_min(1e-5).log()).sum(), p.min()};
}

at::Tensor code_space(const at::Tensor& x, const LfqOptions& o) {
  if (!o.spherical()) return x;
  return torch::nn::functional::normalize(x, torch::nn::functional::NormalizeFuncOptions().dim(-1)) *
         o.codebook_scale();
}

TEST(Lfq, EveryIndexRoundTripsThroughADistinctCode) {
  for (bool spherical : {false, true}) {
    Lfq lfq(LfqOptions(16).codebook_scale(0.5).spherical(spherical));
    const at::Tensor all = torch::arange(16, torch::kInt64);
    const at::Tensor codes = lfq.indices_to_codes(all);
    ASSERT_EQ(codes.sizes(), (std::vector<int64_t>{16, 4}));
    EXPECT_TRUE(torch::equal(lfq.codes_to_indices(codes), all));
    EXPECT_EQ(std::get<0>(torch::unique_dim(codes, 0)).size(0), 16);
    const double value = spherical ? 0.5 / 2 : 0.5;  // scale / sqrt(bits) on the sphere
    EXPECT_TRUE(torch::allclose(codes.abs(), torch::full_like(codes, value)));
  }
}

TEST(Lfq, FirstDimensionIsTheMostSignificantBit) {
  Lfq lfq(LfqOptions(8));
  // Signs (+,-,-) -> 100b = 4; (-,-,+) -> 1; (+,+,-) -> 6; 0 counts as negative.
  const at::Tensor x =
      torch::tensor({1.0f, -1.0f, -1.0f, -1.0f, -1.0f, 1.0f, 0.5f, 0.5f, -0.2f, 0.0f, 0.0f, 0.0f}).reshape({1, 4, 3});
  EXPECT_TRUE(torch::equal(lfq.encode(x), torch::tensor({{4, 1, 6, 0}}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(lfq.decode(torch::tensor({{4}}, torch::kInt64)),
                           torch::tensor({1.0f, -1.0f, -1.0f}).reshape({1, 1, 3})));
}

TEST(Lfq, DecodeOfEncodeIsTheForwardValueInTrainingAndEval) {
  torch::manual_seed(2);
  for (bool spherical : {false, true}) {
    for (int64_t dim : {5, 9}) {  // 5: no projection; 9: projections in and out
      Lfq lfq(LfqOptions(32).dim(dim).spherical(spherical).codebook_scale(1.5).commitment_loss_weight(0.25));
      const at::Tensor x = torch::randn({2, 11, dim});
      const QuantizerOutput train = lfq.quantize(x, {});
      EXPECT_TRUE(torch::equal(lfq.encode(x), train.indices));
      EXPECT_TRUE(torch::allclose(lfq.decode(train.indices), train.quantized, 1e-5, 1e-6));
      EXPECT_EQ(train.losses.size(), 2u);
      lfq.eval();
      const QuantizerOutput eval = lfq.quantize(x, {});
      EXPECT_TRUE(eval.losses.empty());
      EXPECT_TRUE(torch::allclose(eval.quantized, train.quantized, 1e-5, 1e-6));
    }
  }
}

// (bits, spherical, codebook_scale): the entropy loss and its gradient equal the clamped
// brute-force definition on inputs where every code has p >= 1e-5 (where clamping changes nothing).
class LfqEntropy : public ::testing::TestWithParam<std::tuple<int64_t, bool, double>> {};

TEST_P(LfqEntropy, EqualsTheBruteForceDefinitionWithItsGradient) {
  const auto [bits, spherical, scale] = GetParam();
  torch::manual_seed(bits);
  const double inv_t = 1.0 / (scale * scale);  // keeps logits, and so every p, in the same range
  const LfqOptions options = LfqOptions(int64_t{1} << bits)
                                 .spherical(spherical)
                                 .codebook_scale(scale)
                                 .inv_temperature(inv_t)
                                 .diversity_gamma(0.7)
                                 .entropy_loss_weight(0.3);
  Lfq lfq(options);
  const at::Tensor x = (torch::randn({3, 40, bits}) * 0.1).requires_grad_();
  lfq.quantize(x, {}).losses.at("entropy").backward();
  const at::Tensor got_grad = x.grad().clone();
  const at::Tensor loss = lfq.quantize(x, {}).losses.at("entropy");

  const at::Tensor xr = x.detach().clone().requires_grad_();
  const at::Tensor codebook = lfq.indices_to_codes(torch::arange(int64_t{1} << bits));
  const BruteForce ref = brute_force(code_space(xr, options).reshape({-1, bits}), codebook, inv_t);
  ASSERT_GE(ref.min_prob.item<float>(), 1e-5f) << "the inputs must leave every p above the clamp";
  const at::Tensor expected = (ref.per_sample_clamped - 0.7 * ref.codebook) * 0.3;
  expected.backward();
  EXPECT_NEAR(loss.item<float>(), expected.item<float>(), 1e-5);
  EXPECT_TRUE(torch::allclose(got_grad, xr.grad(), 1e-4, 1e-5)) << (got_grad - xr.grad()).abs().max();
}

INSTANTIATE_TEST_SUITE_P(Bits, LfqEntropy,
                         ::testing::Combine(::testing::Range<int64_t>(1, 9), ::testing::Bool(),
                                            ::testing::Values(1.0, 2.5)));

// Codes built here bit by bit (index = sum_j bit_j 2^(d-1-j), bit set = +a), independently of Lfq.
at::Tensor explicit_codes(int64_t bits, double code_value, at::ScalarType type) {
  at::Tensor codes = torch::empty({int64_t{1} << bits, bits}, torch::kFloat64);
  for (int64_t i = 0; i < codes.size(0); ++i) {
    for (int64_t j = 0; j < bits; ++j) codes[i][j] = ((i >> (bits - 1 - j)) & 1) ? code_value : -code_value;
  }
  return codes.to(type);
}

// (bits, budget_bytes): lfq_sum_probs equals sum_t softmax_c(2 inv_t <x_t, c>) over the explicit
// codes, forward and gradient of a random linear functional, whatever the chunking.
class LfqSumProbs : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(LfqSumProbs, EqualsTheExplicitSoftmaxWithItsGradient) {
  const auto [bits, budget] = GetParam();
  torch::manual_seed(100 + bits);
  const int64_t k = int64_t{1} << bits;
  for (const double code_value : {1.0, 0.35, 2.5}) {
    for (const double inv_t : {0.5, 3.0}) {
      const at::Tensor x = torch::randn({37, bits}) * 0.4;
      const at::Tensor w = torch::randn({k});
      const at::Tensor xr = x.clone().requires_grad_();
      const at::Tensor expected =
          (torch::matmul(xr, explicit_codes(bits, code_value, torch::kFloat32).t()) * (2 * inv_t)).softmax(-1).sum(0);
      (expected * w).sum().backward();
      const at::Tensor xc = x.clone().requires_grad_();
      const at::Tensor got = lfq_sum_probs(xc, inv_t, code_value, budget);
      ASSERT_EQ(got.sizes(), (std::vector<int64_t>{k}));
      (got * w).sum().backward();
      const std::string where = "bits " + std::to_string(bits) + " a " + std::to_string(code_value) + " inv_t " +
                                std::to_string(inv_t) + " budget " + std::to_string(budget);
      EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-5)) << where << (got - expected).abs().max();
      EXPECT_TRUE(torch::allclose(xc.grad(), xr.grad(), 1e-4, 1e-5)) << where << (xc.grad() - xr.grad()).abs().max();
      // The path other devices run, through the same chunks.
      const at::Tensor xo = x.clone().requires_grad_();
      const at::Tensor ops = detail::lfq_sum_probs_ops(xo, inv_t, code_value, budget);
      (ops * w).sum().backward();
      EXPECT_TRUE(torch::allclose(ops, expected, 1e-5, 1e-5)) << where << " ops " << (ops - expected).abs().max();
      EXPECT_TRUE(torch::allclose(xo.grad(), xr.grad(), 1e-4, 1e-5))
          << where << " ops " << (xo.grad() - xr.grad()).abs().max();
    }
  }
}

// Budget 1: one token per chunk; 5000: a few tokens; default: one chunk.
INSTANTIATE_TEST_SUITE_P(Bits, LfqSumProbs,
                         ::testing::Combine(::testing::Range<int64_t>(1, 8),
                                            ::testing::Values(int64_t{1}, int64_t{5000}, int64_t{64} << 20)));

TEST(Lfq, SumProbsInDoubleMatchesTheSoftmaxToDoublePrecisionEvenWhenSaturated) {
  torch::manual_seed(8);
  const int64_t bits = 9;
  const at::Tensor x = torch::randn({50, bits}, torch::kFloat64);  // inv_t 100: most codes far below 1e-5
  const at::Tensor w = torch::randn({int64_t{1} << bits}, torch::kFloat64);
  const at::Tensor xr = x.clone().requires_grad_();
  const at::Tensor expected =
      (torch::matmul(xr, explicit_codes(bits, 1.0, torch::kFloat64).t()) * 200.0).softmax(-1).sum(0);
  (expected * w).sum().backward();
  const at::Tensor xc = x.clone().requires_grad_();
  const at::Tensor got = lfq_sum_probs(xc, 100.0, 1.0, 3000);
  (got * w).sum().backward();
  EXPECT_TRUE(torch::allclose(got, expected, 1e-10, 1e-12)) << (got - expected).abs().max();
  EXPECT_TRUE(torch::allclose(xc.grad(), xr.grad(), 1e-9, 1e-10)) << (xc.grad() - xr.grad()).abs().max();
  const at::Tensor xo = x.clone().requires_grad_();
  const at::Tensor ops = detail::lfq_sum_probs_ops(xo, 100.0, 1.0, 3000);
  (ops * w).sum().backward();
  EXPECT_TRUE(torch::allclose(ops, expected, 1e-10, 1e-12)) << (ops - expected).abs().max();
  EXPECT_TRUE(torch::allclose(xo.grad(), xr.grad(), 1e-9, 1e-10)) << (xo.grad() - xr.grad()).abs().max();
}

TEST(Lfq, SumProbsPerCodebookEqualsEachCodebookAlone) {
  torch::manual_seed(9);
  const at::Tensor x = torch::randn({3, 21, 5}) * 0.3;
  const at::Tensor w = torch::randn({3, 32});
  const at::Tensor xb = x.clone().requires_grad_();
  const at::Tensor both = lfq_sum_probs(xb, 2.0, 1.0);
  ASSERT_EQ(both.sizes(), (std::vector<int64_t>{3, 32}));
  (both * w).sum().backward();
  for (int64_t g = 0; g < 3; ++g) {
    const at::Tensor xg = x[g].clone().requires_grad_();
    const at::Tensor one = lfq_sum_probs(xg, 2.0, 1.0);
    (one * w[g]).sum().backward();
    EXPECT_TRUE(torch::allclose(both[g], one, 1e-6, 1e-6)) << "codebook " << g;
    EXPECT_TRUE(torch::allclose(xb.grad()[g], xg.grad(), 1e-6, 1e-6)) << "codebook " << g;
  }
  EXPECT_EQ(lfq_sum_probs(torch::zeros({0, 5}), 2.0, 1.0).abs().sum().item<float>(), 0.0f);
}

TEST(Lfq, SaturatedBitsKeepTheExactEntropyWithinTheClampBound) {
  // Default inv_temperature 100 on unit inputs: most codes fall below 1e-5. The per-sample term is
  // the exact entropy; it differs from the clamped one by at most K * 1e-5 / e (lfq_entropy.cpp).
  torch::manual_seed(5);
  const int64_t bits = 8, k = 256;
  Lfq lfq{LfqOptions(k)};
  const at::Tensor x = torch::randn({2, 64, bits}, torch::kFloat64) * 0.01;
  const at::Tensor loss = lfq.quantize(x, {}).losses.at("entropy");
  const BruteForce ref = brute_force(x.reshape({-1, bits}), lfq.indices_to_codes(torch::arange(k)), 100.0);
  ASSERT_LT(ref.min_prob.item<double>(), 1e-5);
  EXPECT_NEAR(loss.item<double>(), ((ref.per_sample_exact - ref.codebook) * 0.1).item<double>(), 1e-10);
  const double gap = (ref.per_sample_clamped - ref.per_sample_exact).abs().item<double>();
  EXPECT_LE(gap, k * 1e-5 / std::exp(1.0));
}

// The arithmetic each thread of the CUDA kernels runs (lfq_halves.h, cuda/lfq.cu), here on the CPU: the
// halves its entries make give lfq_sum_probs' sum, and its bit gradients give autograd's gradient of it.
TEST(Lfq, TheKernelsEntriesAndBitGradientsGiveTheSumAndItsGradient) {
  torch::manual_seed(7);
  const double inv_t = 0.7, a = 0.5;
  const float z_scale = static_cast<float>(4 * inv_t * a);
  for (const int64_t bits : {1, 2, 5, 10, 13}) {
    const int64_t n = 6, h = bits / 2, l = bits - h;
    const at::Tensor x = torch::randn({n, bits}) * 1.5;
    const at::Tensor hi = torch::empty({n, int64_t{1} << h}), lo = torch::empty({n, int64_t{1} << l});
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x[t].data_ptr<float>();
      for (int64_t i = 0; i < hi.size(1); ++i) hi[t][i] = lfq_halves::entry(xt, h, z_scale, i);
      for (int64_t i = 0; i < lo.size(1); ++i) lo[t][i] = lfq_halves::entry(xt + h, l, z_scale, i);
    }
    EXPECT_TRUE(torch::allclose(torch::mm(hi.t(), lo).reshape({-1}), lfq_sum_probs(x, inv_t, a), 1e-5, 1e-7))
        << bits << " bits";

    const at::Tensor g = torch::randn({int64_t{1} << h, int64_t{1} << l});
    const at::Tensor xg = x.clone().requires_grad_();
    (lfq_sum_probs(xg, inv_t, a).reshape(g.sizes()) * g).sum().backward();
    const at::Tensor dhi = torch::mm(lo, g.t()), dlo = torch::mm(hi, g);
    at::Tensor grad = torch::zeros({n, bits});
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x[t].data_ptr<float>();
      std::vector<float> dz(bits, 0.0f);
      for (int64_t i = 0; i < dhi.size(1); ++i) {
        lfq_halves::add_bit_gradients(xt, h, z_scale, i, dhi[t][i].item<float>(), dz.data());
      }
      for (int64_t i = 0; i < dlo.size(1); ++i) {
        lfq_halves::add_bit_gradients(xt + h, l, z_scale, i, dlo[t][i].item<float>(), dz.data() + h);
      }
      for (int64_t j = 0; j < bits; ++j) grad[t][j] = dz[j] * z_scale;
    }
    EXPECT_TRUE(torch::allclose(grad, xg.grad(), 1e-4, 1e-6)) << bits << " bits\n" << grad << "\n" << xg.grad();
  }
}

// The per-sample kernels' arithmetic (lfq_halves.h's bit_entropy and its slope, summed per token, the mean's
// gradient spread over the tokens) gives lfq_per_sample_entropy's value and gradient, saturated bits and
// bits at z = 0 among them.
TEST(Lfq, TheKernelsBitEntropiesGiveThePerSampleEntropyAndItsGradient) {
  torch::manual_seed(8);
  const double inv_t = 0.7, a = 0.5;
  const float z_scale = static_cast<float>(4 * inv_t * a);
  at::Tensor x = torch::randn({9, 12}) * 3;
  x[0][0] = 0.0f;
  x[1][1] = 60.0f;
  x[2][2] = -60.0f;
  const at::Tensor xg = x.clone().requires_grad_();
  const at::Tensor ops = detail::lfq_per_sample_entropy_ops(xg, inv_t, a);
  (ops * 2.5).backward();
  at::Tensor sums = torch::zeros({9}), grad = torch::empty_like(x);
  for (int64_t t = 0; t < x.size(0); ++t) {
    for (int64_t j = 0; j < x.size(1); ++j) {
      const float z = x[t][j].item<float>() * z_scale;
      sums[t] += lfq_halves::bit_entropy(z);
      grad[t][j] = 2.5f / static_cast<float>(x.size(0)) * z_scale * lfq_halves::bit_entropy_slope(z);
    }
  }
  EXPECT_NEAR(sums.mean().item<double>(), ops.item<double>(), 1e-5);
  EXPECT_TRUE(torch::allclose(grad, xg.grad(), 1e-5, 1e-7)) << grad << "\n" << xg.grad();
  EXPECT_FLOAT_EQ(lfq_halves::bit_entropy(0.0f), std::log(2.0f));
  EXPECT_EQ(lfq_halves::bit_entropy_slope(0.0f), 0.0f);
}

TEST(Lfq, ChunksGrowWithTheBudgetAndNeedOnlySqrtKPerToken) {
  EXPECT_EQ(lfq_chunk_tokens(24, 8, 1), 1);  // never below one token
  for (int64_t bits : {1, 2, 7, 10, 16, 24}) {
    int64_t previous = 0;
    for (int64_t budget : {int64_t{1} << 10, int64_t{1} << 20, int64_t{64} << 20}) {
      const int64_t t = lfq_chunk_tokens(bits, 4, budget);
      EXPECT_GE(t, std::max<int64_t>(previous, 1)) << bits << " " << budget;
      previous = t;
    }
  }
  // 64 MiB holds thousands of tokens at K = 2^16 and hundreds at 2^24: O(sqrt K) per token.
  EXPECT_GE(lfq_chunk_tokens(16, 4, int64_t{64} << 20), 4096);
  EXPECT_GE(lfq_chunk_tokens(24, 4, int64_t{64} << 20), 256);
  EXPECT_NEAR(lfq_chunk_tokens(16, 4, int64_t{64} << 20), 2 * lfq_chunk_tokens(16, 8, int64_t{64} << 20), 1);
}

TEST(Lfq, LargeCodebookTrainsWithoutTheFullMatrix) {
  torch::manual_seed(4);
  Lfq lfq(LfqOptions(int64_t{1} << 16));
  const at::Tensor x = torch::randn({2, 1024, 16}, torch::requires_grad());
  const QuantizerOutput out = lfq.quantize(x, {});
  const at::Tensor loss = out.total_loss();
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<float>()));
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
  EXPECT_GT(x.grad().abs().sum().item<float>(), 0.0f);
}

TEST(Lfq, HugeCodebookSumsToTheTokenCount) {
  // K = 2^20 and 2^21 (odd): the sum over all codes of sum_t p_t is the token count, exactly.
  torch::manual_seed(10);
  for (int64_t bits : {20, 21}) {
    const at::Tensor x = torch::randn({40, bits}, torch::kFloat64) * 0.05;
    const at::Tensor sum = lfq_sum_probs(x, 1.0, 1.0, int64_t{1} << 20);
    ASSERT_EQ(sum.numel(), int64_t{1} << bits);
    EXPECT_NEAR(sum.sum().item<double>(), 40.0, 1e-9);
    // Spot-check a few indices against sum_t prod_j sigmoid(+-z_tj), signs read from the index.
    for (int64_t index : {int64_t{0}, (int64_t{1} << (bits - 1)) + 5, (int64_t{1} << bits) - 2}) {
      at::Tensor sign = torch::empty({bits}, torch::kFloat64);
      for (int64_t j = 0; j < bits; ++j) sign[j] = ((index >> (bits - 1 - j)) & 1) ? 1.0 : -1.0;
      const double expected = torch::sigmoid(x * 4.0 * sign).prod(-1).sum().item<double>();
      EXPECT_NEAR(sum[index].item<double>(), expected, 1e-12 * 40) << "bits " << bits << " index " << index;
    }
  }
}

// Counts calls; optionally adds another holder's statistics, as a two-rank sum would.
class CountingReducer final : public Reducer {
 public:
  void sum_(std::vector<at::Tensor>&, const CallSite&) override { ++in_place_calls; }
  at::Tensor sum(const at::Tensor& local, const CallSite& site) override {
    ++calls;
    last_tag = site.tag;
    last_file = site.file;
    last_local = local.detach().clone();
    return other.defined() ? local + other : local;
  }
  at::Tensor gather(const at::Tensor& local, const CallSite&) override { return local; }
  int calls = 0, in_place_calls = 0;
  std::string last_tag, last_file;
  at::Tensor last_local, other;
};

// The memory check counts what a training call holds at its peak (measured 6.2-6.3 times one
// (codebooks, K) float tensor), so 64 codebooks of 2^24 codes are refused up front on a 24 GiB machine
// instead of failing in torch's allocator after a minute.
TEST(Lfq, TheMemoryCheckCountsTheTrainingPeak) {
  const double one = 4.0 * 64 * (int64_t{1} << 24);
  EXPECT_GE(detail::lfq_training_bytes(64, int64_t{1} << 24), 6.3 * one);
  EXPECT_LE(detail::lfq_training_bytes(64, int64_t{1} << 24), 8 * one);
  try {
    Lfq lfq(LfqOptions(int64_t{1} << 24).num_codebooks(1 << 16));
    FAIL() << "65536 codebooks of 2^24 codes were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lfq: the code distribution of 65536 codebook(s) of 16777216 codes needs"),
              std::string::npos)
        << e.what();
  }
}

TEST(Lfq, ReducesOncePerTrainingForwardAndNeverInEval) {
  Lfq lfq(LfqOptions(16).commitment_loss_weight(1.0));
  CountingReducer reducer;
  QuantizeContext ctx;
  ctx.reducer = &reducer;
  for (int64_t n : {0, 1, 13}) {
    reducer.calls = 0;
    const QuantizerOutput out = lfq.quantize(torch::randn({2, n, 4}), ctx);
    EXPECT_EQ(reducer.calls, 1) << "n = " << n;
    EXPECT_EQ(reducer.in_place_calls, 0);
    EXPECT_EQ(reducer.last_tag, "lfq.avg_probs");
    EXPECT_NE(reducer.last_file.find("src/quant/lfq.cpp"), std::string::npos) << reducer.last_file;
    EXPECT_TRUE(torch::isfinite(out.total_loss()).item<bool>()) << "n = " << n;
  }
  lfq.eval();
  reducer.calls = 0;
  lfq.quantize(torch::randn({2, 5, 4}), ctx);
  EXPECT_EQ(reducer.calls, 0);
}

// Per-sample and codebook entropy are both the whole batch's: every term is a sum over the global batch.
TEST(Lfq, TwoHoldersGetTheWholeBatchEntropyLoss) {
  torch::manual_seed(6);
  const LfqOptions options = LfqOptions(32).inv_temperature(2.0);
  Lfq lfq(options);
  const at::Tensor a = torch::randn({1, 9, 5}) * 0.2, b = torch::randn({1, 4, 5}) * 0.2;
  CountingReducer capture;  // the other holder's (count, sum)
  QuantizeContext ctx;
  ctx.reducer = &capture;
  lfq.quantize(b, ctx);
  CountingReducer two_ranks;
  two_ranks.other = capture.last_local;
  ctx.reducer = &two_ranks;
  const at::Tensor got = lfq.quantize(a, ctx).losses.at("entropy");
  const at::Tensor codebook = lfq.indices_to_codes(torch::arange(32));
  const BruteForce whole = brute_force(torch::cat({a, b}, 1).reshape({-1, 5}), codebook, 2.0);
  const at::Tensor per_sample = lfq_per_sample_entropy(torch::cat({a, b}, 1).reshape({-1, 5}), 2.0, 1.0);
  EXPECT_NEAR(got.item<float>(), ((per_sample - whole.codebook) * 0.1).item<float>(), 1e-6);
}

// The reference's entropy over prob (tokens, codebooks, K), each codebook's brute force averaged.
TEST(Lfq, TwoCodebooksAverageEachCodebooksBruteForceEntropy) {
  torch::manual_seed(11);
  for (bool spherical : {false, true}) {
    const LfqOptions options = LfqOptions(16)
                                   .num_codebooks(2)
                                   .spherical(spherical)
                                   .codebook_scale(1.5)
                                   .inv_temperature(1.0)
                                   .diversity_gamma(0.8)
                                   .entropy_loss_weight(0.5);
    Lfq lfq(options);
    EXPECT_EQ(lfq.dim(), 8);
    EXPECT_EQ(lfq.num_indices(), 2);
    const at::Tensor x = (torch::randn({2, 9, 8}) * 0.2).requires_grad_();
    const QuantizerOutput out = lfq.quantize(x, {});
    out.losses.at("entropy").backward();

    const at::Tensor xr = x.detach().clone().requires_grad_();
    const at::Tensor codebook = lfq.indices_to_codes(torch::arange(16));
    at::Tensor per_sample = torch::zeros({}), codebook_entropy = torch::zeros({});
    for (int64_t g = 0; g < 2; ++g) {
      const at::Tensor group = code_space(xr.narrow(2, 4 * g, 4), options).reshape({-1, 4});
      const BruteForce ref = brute_force(group, codebook, 1.0);
      ASSERT_GE(ref.min_prob.item<float>(), 1e-5f);
      per_sample = per_sample + ref.per_sample_clamped / 2;
      codebook_entropy = codebook_entropy + ref.codebook / 2;
    }
    const at::Tensor expected = (per_sample - 0.8 * codebook_entropy) * 0.5;
    expected.backward();
    EXPECT_NEAR(out.losses.at("entropy").item<float>(), expected.item<float>(), 1e-5) << "spherical " << spherical;
    EXPECT_TRUE(torch::allclose(x.grad(), xr.grad(), 1e-4, 1e-5)) << (x.grad() - xr.grad()).abs().max();

    // Indices (b, n, 2): each codebook's own bits; decode(encode) is the forward value.
    ASSERT_EQ(out.indices.sizes(), (std::vector<int64_t>{2, 9, 2}));
    for (int64_t g = 0; g < 2; ++g) {
      const at::Tensor group = x.detach().narrow(2, 4 * g, 4);
      EXPECT_TRUE(torch::equal(out.indices.select(2, g), lfq.codes_to_indices(group)));
    }
    EXPECT_TRUE(torch::equal(lfq.encode(x.detach()), out.indices));
    EXPECT_TRUE(torch::allclose(lfq.decode(out.indices), out.quantized, 1e-5, 1e-6));
    EXPECT_THROW(lfq.decode(torch::zeros({2, 9}, torch::kInt64)), InvalidArgument);
  }
  Lfq projected(LfqOptions(16).num_codebooks(3).dim(5));
  EXPECT_EQ(projected.quantize(torch::randn({1, 4, 5}), {}).indices.sizes(), (std::vector<int64_t>{1, 4, 3}));
}

// With frac_per_sample_entropy < 1 each token joins the entropy subset with probability frac, by a
// hash of (one number drawn from the context's generator, the token's global position).
std::vector<int64_t> expected_subset(uint64_t seed, int64_t first_token, int64_t tokens, float frac) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const uint64_t key = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
  std::vector<int64_t> chosen;
  for (int64_t t = 0; t < tokens; ++t) {
    if (hashed_uniform(key, static_cast<uint64_t>(first_token + t)) < frac) chosen.push_back(t);
  }
  return chosen;
}

TEST(Lfq, SampledFractionComesFromTheContextGeneratorAndTheGlobalPosition) {
  torch::manual_seed(12);
  const LfqOptions options = LfqOptions(16).frac_per_sample_entropy(0.4).inv_temperature(1.0);
  Lfq lfq(options);
  const at::Tensor x = torch::randn({2, 10, 4}) * 0.5;  // 20 tokens
  const auto loss_with_seed = [&](uint64_t seed, CountingReducer* reducer, int64_t first_item = 0) {
    QuantizeContext ctx;
    ctx.generator = at::detail::createCPUGenerator(seed);
    ctx.reducer = reducer;
    ctx.first_item = first_item;
    return lfq.quantize(x, ctx).losses.at("entropy").item<float>();
  };
  CountingReducer reducer;
  const float a = loss_with_seed(7, &reducer);
  const std::vector<int64_t> chosen = expected_subset(7, 0, 20, 0.4f);
  ASSERT_GT(chosen.size(), 0u);
  ASSERT_LT(chosen.size(), 20u);
  EXPECT_EQ(reducer.calls, 1);
  EXPECT_EQ(reducer.last_local[0].item<float>(), static_cast<float>(chosen.size())) << "count of sampled tokens";
  const at::Tensor sampled = x.reshape({-1, 4}).index_select(0, torch::tensor(chosen, torch::kInt64));
  EXPECT_NEAR(reducer.last_local[1].item<float>(),
              (lfq_per_sample_entropy(sampled, 1.0, 1.0) * static_cast<double>(chosen.size())).item<float>(), 1e-5)
      << "sum of the sampled tokens' per-sample entropies";
  EXPECT_EQ(loss_with_seed(7, nullptr), a);
  EXPECT_NE(loss_with_seed(8, nullptr), a);
  EXPECT_NE(loss_with_seed(7, nullptr, /*first_item=*/5), a) << "another place in the batch, another subset";

  const at::Tensor subset = x.reshape({-1, 4}).index_select(0, torch::tensor(chosen, torch::kInt64));
  const BruteForce ref = brute_force(subset, lfq.indices_to_codes(torch::arange(16)), 1.0);
  EXPECT_NEAR(a, ((ref.per_sample_clamped - ref.codebook) * 0.1).item<float>(), 1e-6);
  // Not all tokens: the full batch gives another value.
  const BruteForce all = brute_force(x.reshape({-1, 4}), lfq.indices_to_codes(torch::arange(16)), 1.0);
  EXPECT_GT(std::abs(a - ((all.per_sample_clamped - all.codebook) * 0.1).item<float>()), 1e-4);

  // One reduction per call even when no token is sampled or there are none; the loss stays finite.
  for (int64_t n : {0, 1, 3}) {
    reducer.calls = 0;
    QuantizeContext ctx;
    ctx.reducer = &reducer;  // undefined generator: torch's default one
    const at::Tensor xn = torch::randn({2, n, 4}, torch::requires_grad());
    const at::Tensor loss = lfq.quantize(xn, ctx).total_loss();
    EXPECT_EQ(reducer.calls, 1) << "n = " << n;
    EXPECT_EQ(reducer.last_local.size(0), 2 + 16) << "count, per-sample sum, probabilities";
    EXPECT_LE(reducer.last_local[0].item<float>(), static_cast<float>(2 * n));
    EXPECT_TRUE(torch::isfinite(loss).item<bool>()) << "n = " << n;
    loss.backward();
  }
}

// The breakdown is of the tokens the same call counts: weighted, it is the call's loss, for a mask and
// an entropy subset at another place in the batch; brute force gives its entropies; zeros in eval.
TEST(Lfq, LossTermsAreTheCallsUnweightedTermsOfTheSameTokens) {
  torch::manual_seed(5);
  Lfq lfq(LfqOptions(16)
              .dim(6)
              .frac_per_sample_entropy(0.5)
              .inv_temperature(1.0)
              .diversity_gamma(0.7)
              .entropy_loss_weight(0.2)
              .commitment_loss_weight(0.3));
  const at::Tensor x = torch::randn({3, 8, 6});
  const at::Tensor mask = torch::rand({3, 8}) > 0.3;
  const auto context = [&] {
    QuantizeContext ctx;
    ctx.generator = at::detail::createCPUGenerator(9);
    ctx.first_item = 6;
    ctx.mask = mask;
    return ctx;
  };
  const QuantizerOutput out = lfq.quantize(x, context());
  const LfqLossTerms terms = lfq.loss_terms(x, context());
  EXPECT_NEAR((out.losses.at("entropy") + out.losses.at("commitment")).item<float>(),
              (0.2 * (terms.per_sample_entropy - 0.7 * terms.codebook_entropy) + 0.3 * terms.commitment).item<float>(),
              1e-6);
  QuantizeContext elsewhere = context();
  elsewhere.first_item = 0;  // another subset
  EXPECT_NE(lfq.loss_terms(x, elsewhere).per_sample_entropy.item<float>(), terms.per_sample_entropy.item<float>());
  lfq.eval();
  const LfqLossTerms eval_terms = lfq.loss_terms(x, context());
  for (const at::Tensor& t : {eval_terms.per_sample_entropy, eval_terms.codebook_entropy, eval_terms.commitment}) {
    EXPECT_EQ(t.item<float>(), 0.0f);
  }
}

TEST(Lfq, ACallsInverseTemperatureActsAsTheOptionForThatCallAlone) {
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({2, 8, 4});
  Lfq made_with_default(LfqOptions(16).inv_temperature(100.0).diversity_gamma(0.8));
  Lfq made_with_two(LfqOptions(16).inv_temperature(2.0).diversity_gamma(0.8));
  QuantizeContext at_two;
  at_two.inv_temperature = 2.0;
  const at::Tensor expected = made_with_two.quantize(x, {}).losses.at("entropy");
  EXPECT_NEAR(made_with_default.quantize(x, at_two).losses.at("entropy").item<float>(), expected.item<float>(), 1e-6);
  EXPECT_NE(made_with_default.quantize(x, {}).losses.at("entropy").item<float>(), expected.item<float>());
  const LfqLossTerms terms = made_with_default.loss_terms(x, at_two);
  const LfqLossTerms option_terms = made_with_two.loss_terms(x, {});
  EXPECT_NEAR(terms.per_sample_entropy.item<float>(), option_terms.per_sample_entropy.item<float>(), 1e-6);
  EXPECT_NEAR(terms.codebook_entropy.item<float>(), option_terms.codebook_entropy.item<float>(), 1e-6);
  QuantizeContext invalid;
  invalid.inv_temperature = 0.0;
  EXPECT_THROW(made_with_default.quantize(x, invalid), InvalidArgument);
}

TEST(Lfq, TotalLossGradientMatchesFiniteDifferences) {
  for (bool spherical : {false, true}) {
    Lfq lfq(LfqOptions(8).spherical(spherical).inv_temperature(1.5).commitment_loss_weight(0.25).diversity_gamma(0.6));
    const at::Tensor x0 =
        torch::tensor({0.3, -0.7, 0.2, -0.4, 0.9, 0.5, 0.6, 0.1, -0.8, -0.3, -0.2, 0.4}, torch::kFloat64)
            .reshape({1, 4, 3});
    const at::Tensor x = x0.clone().requires_grad_();
    lfq.quantize(x, {}).total_loss().backward();
    const double eps = 1e-6;
    for (int64_t i = 0; i < x0.numel(); ++i) {
      at::Tensor plus = x0.clone(), minus = x0.clone();
      plus.view(-1)[i] += eps;
      minus.view(-1)[i] -= eps;
      const double numeric =
          (lfq.quantize(plus, {}).total_loss() - lfq.quantize(minus, {}).total_loss()).item<double>() / (2 * eps);
      EXPECT_NEAR(x.grad().view(-1)[i].item<double>(), numeric, 1e-7) << "element " << i << " spherical " << spherical;
    }
  }
}

TEST(Lfq, InvalidOptionsNameTheValue) {
  const auto message = [](const LfqOptions& o) {
    try {
      Lfq lfq(o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(LfqOptions(12)).find("codebook_size = 12"), std::string::npos);
  EXPECT_NE(message(LfqOptions(1)).find("codebook_size = 1 "), std::string::npos);
  for (double frac : {0.0, -0.5, 1.5}) {
    std::ostringstream expected;
    expected << "frac_per_sample_entropy = " << frac;
    EXPECT_NE(message(LfqOptions(16).frac_per_sample_entropy(frac)).find(expected.str()), std::string::npos) << frac;
  }
  EXPECT_EQ(message(LfqOptions(16).frac_per_sample_entropy(0.5)), "accepted");
  EXPECT_NE(message(LfqOptions(16).num_codebooks(0)).find("num_codebooks = 0"), std::string::npos);
  EXPECT_EQ(message(LfqOptions(16).num_codebooks(2)), "accepted");
  EXPECT_NE(message(LfqOptions(16).inv_temperature(0)).find("inv_temperature = 0"), std::string::npos);
  EXPECT_NE(message(LfqOptions(16).dim(0)).find("dim = 0"), std::string::npos);
  EXPECT_NE(message(LfqOptions(16).entropy_loss_weight(-1)).find("entropy_loss_weight = -1"), std::string::npos);
  EXPECT_NE(message(LfqOptions(16).codebook_scale(0)).find("codebook_scale = 0"), std::string::npos);
  Lfq lfq(LfqOptions(16));
  EXPECT_THROW(lfq.decode(torch::tensor({{16}}, torch::kInt64)), InvalidArgument);
  EXPECT_THROW(lfq.quantize(torch::randn({2, 3, 5}), {}), InvalidArgument);
}

TEST(Lfq, RegistryBuildsItFromEveryKey) {
  const std::map<std::string, double> values = {{"codebook_size", 64},
                                                {"dim", 9},
                                                {"entropy_loss_weight", 0.2},
                                                {"commitment_loss_weight", 0.5},
                                                {"diversity_gamma", 0.9},
                                                {"inv_temperature", 50},
                                                {"codebook_scale", 2},
                                                {"num_codebooks", 2},
                                                {"frac_per_sample_entropy", 0.5},
                                                {"soft_clamp", 3},
                                                {"entropy_loss_offset", 1.5},
                                                {"cosine_sim_project_in", 2.5}};
  OptionReader reader;
  reader.integer = [&](const std::string& key) { return static_cast<int64_t>(values.at(key)); };
  reader.real = [&](const std::string& key) { return values.at(key); };
  reader.boolean = [](const std::string& key) {
    if (key == "projection_has_bias") return false;
    EXPECT_TRUE(key == "spherical" || key == "force_projections" || key == "softplus_entropy" ||
                key == "orthogonal_rotation")
        << key;
    return true;
  };
  const auto q = std::dynamic_pointer_cast<Lfq>(make_quantizer("lfq", reader));
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dim(), 9);
  EXPECT_EQ(q->bits(), 6);
  EXPECT_EQ(q->num_indices(), 2);
  const LfqOptions& o = q->options();
  EXPECT_EQ(o.frac_per_sample_entropy(), 0.5);
  EXPECT_EQ(o.entropy_loss_weight(), 0.2);
  EXPECT_EQ(o.commitment_loss_weight(), 0.5);
  EXPECT_EQ(o.diversity_gamma(), 0.9);
  EXPECT_EQ(o.inv_temperature(), 50);
  EXPECT_EQ(o.codebook_scale(), 2);
  EXPECT_TRUE(o.spherical());
  EXPECT_FALSE(o.projection_has_bias());
  EXPECT_TRUE(o.force_projections() && o.softplus_entropy());
  EXPECT_EQ(o.soft_clamp(), 3);
  EXPECT_EQ(o.entropy_loss_offset(), 1.5);
  EXPECT_EQ(o.cosine_sim_project_in(), 2.5);
  EXPECT_TRUE(o.orthogonal_rotation());
  EXPECT_FALSE(q->named_parameters().contains("project_in.bias"));
  EXPECT_EQ(q->named_parameters()["project_in.weight"].sizes(), (c10::IntArrayRef{9, 12}));  // CosineSimLinear's
  EXPECT_EQ(q->named_buffers()["orthogonal_rot"].sizes(), (c10::IntArrayRef{6, 6}));
}

}  // namespace
}  // namespace lockstep::quant
