#include "lockstep/quant/fsq.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/quant/registry.h"
#include "quant/fsq_kernel.h"

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
  const at::Tensor sweep =
      torch::linspace(-8, 8, 4001).unsqueeze(1).expand({4001, static_cast<int64_t>(levels.size())});
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

TEST(Fsq, HardClampBoundMatchesHandComputedValuesAndPassesGradientOnlyInside) {
  // Symmetric, L = 5: 2/4 * floor(4 (clamp z + 1)/2 + 0.5) - 1: z = 0.3 -> floor(3.1) -> 0.5;
  // z = -0.6 -> floor(1.3) -> -0.5; z = 2 -> clamp 1 -> floor(4.5) -> 1. d/dz = 2/4 / 2 * 4 = 1 inside.
  Fsq symmetric(FsqOptions({5}).preserve_symmetry(true).bound_hard_clamp(true));
  const at::Tensor z = torch::tensor({0.3f, -0.6f, 2.0f}).reshape({3, 1}).requires_grad_();
  const at::Tensor codes = symmetric.quantize_codes(z);
  EXPECT_TRUE(torch::equal(codes.detach(), torch::tensor({0.5f, -0.5f, 1.0f}).reshape({3, 1}))) << codes;
  codes.sum().backward();
  EXPECT_TRUE(torch::equal(z.grad(), torch::tensor({1.0f, 1.0f, 0.0f}).reshape({3, 1}))) << z.grad();
  // Default, L = 8: half = 3.5035, offset 0.5, shift 0.5 / half (no atanh): z = 0 -> round(0) = 0;
  // z = 0.5 -> round(1.75) = 2 -> 2/4; z = 5 -> round(3.0035) = 3 -> 3/4. d/dz = half / 4 inside.
  Fsq plain(FsqOptions({8}).bound_hard_clamp(true));
  const at::Tensor y = torch::tensor({0.0f, 0.5f, 5.0f}).reshape({3, 1}).requires_grad_();
  const at::Tensor y_codes = plain.quantize_codes(y);
  EXPECT_TRUE(torch::equal(y_codes.detach(), torch::tensor({0.0f, 0.5f, 0.75f}).reshape({3, 1}))) << y_codes;
  y_codes.sum().backward();
  EXPECT_TRUE(torch::allclose(y.grad(), torch::tensor({3.5035f / 4, 3.5035f / 4, 0.0f}).reshape({3, 1}))) << y.grad();
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

// The definition as a chain of torch ops (the implementation before the fused kernel): the
// reference the kernel is compared with. `hard_clamp`: clamp(., -1, 1) where it has tanh.
struct ReferenceFsq {
  ReferenceFsq(const std::vector<int64_t>& levels, bool symmetric, bool hard_clamp = false)
      : symmetric(symmetric), hard_clamp(hard_clamp) {
    std::vector<int64_t> b;
    int64_t k = 1;
    for (int64_t l : levels) {
      b.push_back(k);
      k *= l;
    }
    this->levels = torch::tensor(levels, torch::kInt64).to(torch::kFloat32);
    basis = torch::tensor(b, torch::kInt64);
  }
  // The clamp with torch 2's gradient, 0 from the ends on (LibTorch 1.13's clamp passes it at the ends).
  at::Tensor squash(const at::Tensor& a) const {
    return hard_clamp ? torch::where((a > -1) & (a < 1), a, a.clamp(-1, 1).detach()) : a.tanh();
  }
  at::Tensor shift_of(const at::Tensor& ratio) const { return hard_clamp ? ratio : ratio.atanh(); }
  at::Tensor quantize_codes(const at::Tensor& z) const {
    auto round_ste = [](const at::Tensor& t) { return t + (t.round() - t).detach(); };
    auto floor_ste = [](const at::Tensor& t) { return t + (t.floor() - t).detach(); };
    if (symmetric) {
      const at::Tensor lm1 = levels - 1;
      return floor_ste(lm1 * (squash(z) + 1) / 2 + 0.5) * (2 / lm1) - 1;
    }
    const at::Tensor half_l = (levels - 1) * (1 + 1e-3) / 2;
    const at::Tensor offset =
        torch::where(levels.remainder(2) == 0, torch::full_like(levels, 0.5), torch::zeros_like(levels));
    return round_ste(squash(z + shift_of(offset / half_l)) * half_l - offset) / (levels / 2).floor();
  }
  // The value that is rounded (default) or floored (symmetric), in double: a kernel that differs
  // from the reference may do so only where this lies next to a rounding boundary.
  at::Tensor pre_rounding(const at::Tensor& z) const {
    const at::Tensor l = levels.to(torch::kFloat64), zd = z.to(torch::kFloat64);
    if (symmetric) return (l - 1) * (squash(zd) + 1) / 2 + 0.5;
    const at::Tensor half_l = (l - 1) * (1 + 1e-3) / 2;
    const at::Tensor offset = torch::where(l.remainder(2) == 0, torch::full_like(l, 0.5), torch::zeros_like(l));
    return squash(zd + shift_of(offset / half_l)) * half_l - offset + 0.5;  // boundaries at integers
  }
  at::Tensor codes_to_indices(const at::Tensor& codes) const {
    at::Tensor level_index;
    if (symmetric) {
      level_index = (codes + 1) / (2 / (levels - 1));
    } else {
      const at::Tensor half_width = (levels / 2).floor();
      level_index = codes * half_width + half_width;
    }
    return (level_index.round().to(torch::kInt64) * basis).sum(-1);
  }
  bool symmetric, hard_clamp;
  at::Tensor levels, basis;
};

// Inputs that probe the kernel: normal values, large |z| of both signs, infinities' neighbours,
// and every rounding boundary of each dimension with its float neighbours.
at::Tensor probe_inputs(const std::vector<int64_t>& levels, bool symmetric, bool hard_clamp, int64_t random_tokens) {
  const int64_t L = static_cast<int64_t>(levels.size());
  std::vector<at::Tensor> rows;
  rows.push_back(torch::randn({random_tokens, L}) * 2);
  rows.push_back(torch::randn({random_tokens, L}) * 30);
  for (float v : {0.0f, -0.0f, 0.625f, -0.625f, 1.0f, 8.9f, 9.1f, 44.0f, 88.0f, 1e4f, 3e38f}) {
    rows.push_back(torch::full({1, L}, v));
    rows.push_back(torch::full({1, L}, -v));
  }
  // Boundaries: default round(b) with b = t(z + shift) * half - offset at b = k + 0.5;
  // symmetric floor at (L-1)(t(z) + 1)/2 + 0.5 = j; t is tanh, or the clamp (its own inverse inside).
  int64_t most = 0;
  for (int64_t l : levels) most = std::max(most, l);
  for (int64_t k = -most; k <= most; ++k) {
    std::vector<float> row;
    for (int64_t l : levels) {
      const auto inverse = [&](double t) { return hard_clamp ? t : std::atanh(t); };
      double z;
      if (symmetric) {
        z = inverse(std::clamp(2.0 * (double(k + l / 2) - 0.5) / double(l - 1) - 1.0, -0.999999, 0.999999));
      } else {
        const double half = double(float(l - 1) * 1.001f) / 2, offset = l % 2 == 0 ? 0.5 : 0.0;
        const double target = std::clamp((double(k) + 0.5 + offset) / half, -0.999999, 0.999999);
        z = inverse(target) - inverse(offset / half);
      }
      row.push_back(static_cast<float>(z));
    }
    const at::Tensor r = torch::tensor(row).unsqueeze(0);
    rows.push_back(r);
    rows.push_back(torch::nextafter(r, torch::full_like(r, INFINITY)));
    rows.push_back(torch::nextafter(r, torch::full_like(r, -INFINITY)));
  }
  return torch::cat(rows);
}

class FsqKernel : public ::testing::TestWithParam<std::tuple<int64_t, bool, bool>> {};

// Codes, indices and gradients of the fused kernel against the torch-op reference for every level
// count 2..16 (alone and beside other dimensions), with either bound and either squashing function. Values and indices
// agree exactly except where the reference's value lies within 1e-5 of a rounding boundary (the two tanh differ by an
// ulp or so): there the kernel may pick the neighbouring level, consistently in its code and its index.
TEST_P(FsqKernel, MatchesTheTorchOpReference) {
  const auto [level, symmetric, hard_clamp] = GetParam();
  torch::manual_seed(level * 4 + symmetric * 2 + hard_clamp);
  for (const std::vector<int64_t>& levels : {std::vector<int64_t>{level}, std::vector<int64_t>{3, level, 8, 5}}) {
    SCOPED_TRACE(::testing::Message() << "levels " << at::IntArrayRef(levels) << " symmetric " << symmetric
                                      << " hard clamp " << hard_clamp);
    Fsq fsq(FsqOptions(levels).preserve_symmetry(symmetric).bound_hard_clamp(hard_clamp));
    ReferenceFsq ref(levels, symmetric, hard_clamp);
    const at::Tensor z = probe_inputs(levels, symmetric, hard_clamp, 5000);

    const at::Tensor zk = z.clone().requires_grad_();
    const FsqCodes got = fsq.quantize_and_index(zk);
    const at::Tensor zr = z.clone().requires_grad_();
    const at::Tensor want = ref.quantize_codes(zr);
    const at::Tensor want_indices = ref.codes_to_indices(want.detach());

    const at::Tensor differ = got.codes.detach() != want.detach();
    const at::Tensor pre = ref.pre_rounding(z);
    const at::Tensor near_boundary = (pre - pre.round()).abs() < 1e-5;
    EXPECT_EQ((differ & ~near_boundary).sum().item<int64_t>(), 0)
        << "z " << z.masked_select(differ & ~near_boundary).slice(0, 0, 8);
    const at::Tensor step = symmetric ? 2 / (ref.levels - 1) : 1 / (ref.levels / 2).floor();
    const at::Tensor gap = (got.codes.detach() - want.detach()).abs();
    EXPECT_TRUE(((gap == 0) | ((gap - step.expand_as(gap)).abs() < 1e-6)).all().item<bool>());
    // Off the probed boundaries (the first 2 * 5000 rows are random) differences are rare.
    EXPECT_LE(differ.slice(0, 0, 10000).sum().item<int64_t>(), 10);
    // Indices differ only in tokens whose codes do, and always match the kernel's own codes.
    EXPECT_TRUE(torch::equal(got.indices.masked_select(~differ.any(-1)), want_indices.masked_select(~differ.any(-1))));
    EXPECT_TRUE(torch::equal(fsq.codes_to_indices(got.codes.detach()), got.indices));
    EXPECT_TRUE(torch::equal(fsq.indices_to_codes(got.indices), got.codes.detach()));
    EXPECT_TRUE(torch::equal(fsq.codes_to_indices(want.detach()), want_indices));

    // The library's own torch-op path (what runs off the CPU) is that reference, bit for bit.
    const at::Tensor zt = z.clone().requires_grad_();
    const FsqCodes torch_path = detail::fsq_forward_torch(fsq.kernel_plan(), zt, {});
    EXPECT_TRUE(torch::equal(torch_path.codes.detach(), want.detach()));
    EXPECT_TRUE(torch::equal(torch_path.indices, want_indices));

    const at::Tensor upstream = torch::rand_like(z) * 2 - 1;
    (got.codes * upstream).sum().backward();
    (want * upstream).sum().backward();
    (torch_path.codes * upstream).sum().backward();
    EXPECT_TRUE(torch::allclose(zk.grad(), zr.grad(), 1e-5, 1e-6))
        << (zk.grad() - zr.grad()).abs().max() << " at z " << z.flatten()[(zk.grad() - zr.grad()).abs().argmax()];
    EXPECT_TRUE(torch::allclose(zt.grad(), zr.grad(), 1e-5, 1e-6)) << (zt.grad() - zr.grad()).abs().max();
  }
}

INSTANTIATE_TEST_SUITE_P(EveryLevelCount, FsqKernel,
                         ::testing::Combine(::testing::Range<int64_t>(2, 17), ::testing::Bool(), ::testing::Bool()));

TEST(FsqKernel, ConvertsOtherDtypesAndLayoutsAndKeepsTheCodebookAxis) {
  torch::manual_seed(3);
  Fsq fsq(FsqOptions({8, 5, 5, 5}));
  const at::Tensor z = torch::randn({2, 7, 3, 4}) * 2;
  const FsqCodes base = fsq.quantize_and_index(z);
  EXPECT_EQ(base.indices.sizes(), (std::vector<int64_t>{2, 7, 3}));
  EXPECT_EQ(base.codes.sizes(), z.sizes());
  // A transposed (non-contiguous) view of the same values.
  const at::Tensor zt = z.transpose(0, 2).contiguous().transpose(0, 2);
  ASSERT_FALSE(zt.is_contiguous());
  EXPECT_TRUE(torch::equal(fsq.quantize_and_index(zt).codes, base.codes));
  // Double in: computed in float32, gradient flows back as double.
  const at::Tensor zd = z.to(torch::kFloat64).requires_grad_();
  const FsqCodes d = fsq.quantize_and_index(zd);
  EXPECT_EQ(d.codes.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(d.indices, base.indices));
  d.codes.sum().backward();
  EXPECT_EQ(zd.grad().scalar_type(), torch::kFloat64);
  EXPECT_GT(zd.grad().abs().min().item<double>(), 0);
  EXPECT_THROW(fsq.quantize_and_index(torch::randn({3, 5})), InvalidArgument);
  EXPECT_EQ(fsq.quantize_and_index(torch::randn({0, 4})).indices.numel(), 0);
  // NaN stays NaN in the codes (its index is meaningless, as with the torch ops).
  EXPECT_TRUE(fsq.quantize_codes(torch::full({3, 4}, NAN)).isnan().all().item<bool>());
  // Preallocated outputs: the same values, and shapes checked.
  at::Tensor codes = torch::empty({2, 7, 3, 4}), indices = torch::empty({2, 7, 3}, torch::kInt64);
  fsq.quantize_and_index_out(z, codes, indices);
  EXPECT_TRUE(torch::equal(codes, base.codes));
  EXPECT_TRUE(torch::equal(indices, base.indices));
  at::Tensor wrong = torch::empty({2, 7, 3}, torch::kInt32);
  EXPECT_THROW(fsq.quantize_and_index_out(z, codes, wrong), InvalidArgument);
}

TEST(FsqKernel, ThreadCountDoesNotChangeTheResult) {
  torch::manual_seed(4);
  Fsq fsq(FsqOptions({7, 5, 5, 5}).preserve_symmetry(true).noise_dropout(0.3));
  fsq.train();
  const at::Tensor x = torch::randn({8, 40000, 4});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  QuantizeContext ctx;
  ctx.generator = at::detail::createCPUGenerator(11);
  const QuantizerOutput one = fsq.quantize(x, ctx);
  at::set_num_threads(2);
  ctx.generator = at::detail::createCPUGenerator(11);
  const QuantizerOutput two = fsq.quantize(x, ctx);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.quantized, two.quantized));
  EXPECT_TRUE(torch::equal(one.indices, two.indices));
}

TEST(FsqNoiseDropout, NeedsTheSymmetricBoundAndAProbability) {
  try {
    Fsq fsq(FsqOptions({5, 5}).noise_dropout(0.1));
    FAIL() << "noise dropout without preserve_symmetry was accepted";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("noise_dropout = 0.1"), std::string::npos) << what;
    EXPECT_NE(what.find("preserve_symmetry"), std::string::npos) << what;
  }
  EXPECT_THROW(Fsq(FsqOptions({5}).preserve_symmetry(true).noise_dropout(1.0)), InvalidArgument);
  EXPECT_THROW(Fsq(FsqOptions({5}).preserve_symmetry(true).noise_dropout(-0.1)), InvalidArgument);
  EXPECT_NO_THROW(Fsq(FsqOptions({5}).noise_dropout(0.0)));
  EXPECT_THROW(Fsq(FsqOptions({(int64_t{1} << 22) + 1})), InvalidArgument);
}

QuantizerOutput noisy(Fsq& fsq, const at::Tensor& x, uint64_t seed, int64_t first_item = 0) {
  QuantizeContext ctx;
  ctx.generator = at::detail::createCPUGenerator(seed);
  ctx.first_item = first_item;
  return fsq.quantize(x, ctx);
}

// The noise of an element is keyed by its place in the global batch: a holder of items [2, 4)
// draws what one process holding items [0, 4) draws for them, and two holders of different items
// draw independently even on identical inputs (they agreed on 87.8% of decisions when the noise
// followed the local position; independent draws with p = 0.5 agree on half).
TEST(FsqNoiseDropout, KeyedByTheGlobalPositionOfEachElement) {
  Fsq fsq(FsqOptions({5, 5, 5, 5}).preserve_symmetry(true).noise_dropout(0.5));
  const at::Tensor x = torch::zeros({4, 5000, 4});
  const at::Tensor whole = noisy(fsq, x, 3).quantized;
  const at::Tensor second_half = noisy(fsq, x.narrow(0, 2, 2), 3, /*first_item=*/2).quantized;
  EXPECT_TRUE(torch::equal(second_half, whole.narrow(0, 2, 2)));
  const at::Tensor first_half = noisy(fsq, x.narrow(0, 0, 2), 3, /*first_item=*/0).quantized;
  const double same_decision = ((first_half != 0) == (second_half != 0)).to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(same_decision, 0.5, 0.02);
}

TEST(FsqNoiseDropout, SeededTrainingOnlyAndIndicesUntouched) {
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({4, 300, 4}) * 2;
  Fsq plain(FsqOptions({7, 5, 5, 4}).preserve_symmetry(true));
  Fsq zero(FsqOptions({7, 5, 5, 4}).preserve_symmetry(true).noise_dropout(0.0));
  Fsq fsq(FsqOptions({7, 5, 5, 4}).preserve_symmetry(true).noise_dropout(0.25));
  const QuantizerOutput clean = plain.quantize(x, {});
  EXPECT_TRUE(torch::equal(noisy(zero, x, 1).quantized, clean.quantized));

  const QuantizerOutput a = noisy(fsq, x, 1), b = noisy(fsq, x, 1), c = noisy(fsq, x, 2);
  EXPECT_TRUE(torch::equal(a.quantized, b.quantized));
  EXPECT_FALSE(torch::equal(a.quantized, c.quantized));
  EXPECT_FALSE(torch::equal(a.quantized, clean.quantized));
  EXPECT_TRUE(torch::equal(a.indices, clean.indices));
  EXPECT_TRUE(torch::equal(c.indices, clean.indices));
  EXPECT_LE(a.quantized.abs().max().item<float>(), 1.0f);
  EXPECT_LE((a.quantized - clean.quantized).abs().max().item<float>(), 0.5f);

  fsq.eval();
  EXPECT_TRUE(torch::equal(noisy(fsq, x, 1).quantized, clean.quantized));
  fsq.train();
  // An undefined generator draws from torch's default one.
  torch::manual_seed(9);
  const at::Tensor d1 = fsq.quantize(x, {}).quantized;
  torch::manual_seed(9);
  EXPECT_TRUE(torch::equal(fsq.quantize(x, {}).quantized, d1));
  EXPECT_FALSE(torch::equal(fsq.quantize(x, {}).quantized, d1));  // the default generator advanced

  // The gradient is the noiseless straight-through one.
  const at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  noisy(fsq, xa, 3).quantized.sum().backward();
  plain.quantize(xb, {}).quantized.sum().backward();
  EXPECT_TRUE(torch::equal(xa.grad(), xb.grad()));
}

// Off the CPU the noise comes from the same counter-based hash: the torch-op path adds exactly the
// fused kernel's noise to exactly the same elements (where both paths round to the same code).
TEST(FsqNoiseDropout, TheTorchPathAddsTheKernelsNoise) {
  torch::manual_seed(12);
  Fsq fsq(FsqOptions({7, 5, 5, 4}).preserve_symmetry(true).noise_dropout(0.5));
  const at::Tensor z = torch::randn({20000, 4}) * 2;
  const int64_t tokens = z.size(0);
  detail::FsqNoise noise;
  noise.seed = 0x1234567890abcdefULL;
  noise.threshold = 1u << 31;
  noise.element_offset = 123457;
  auto fused = [&](const detail::FsqNoise& with) {
    at::Tensor codes = torch::empty_like(z);
    at::Tensor indices = torch::empty({tokens}, torch::kInt64);
    detail::fsq_forward_tokens(fsq.kernel_plan(), z.data_ptr<float>(), codes.data_ptr<float>(),
                               indices.data_ptr<int64_t>(), nullptr, with, 0, tokens);
    return codes;
  };
  const at::Tensor clean_fused = fused({}), noisy_fused = fused(noise);
  const at::Tensor clean_torch = detail::fsq_forward_torch(fsq.kernel_plan(), z, {}).codes;
  const at::Tensor noisy_torch = detail::fsq_forward_torch(fsq.kernel_plan(), z, noise).codes;
  const at::Tensor same = clean_fused == clean_torch;
  EXPECT_LE((~same).sum().item<int64_t>(), 10);  // a tanh ulp on a rounding boundary
  EXPECT_TRUE(torch::equal(noisy_fused.masked_select(same), noisy_torch.masked_select(same)));
  // Half the elements drew noise; those at +-1 pushed outwards are clamped back, so fewer moved.
  const double moved = (noisy_torch != clean_torch).to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(moved, 0.3);
  EXPECT_NEAR(moved, (noisy_fused != clean_fused).to(torch::kFloat64).mean().item<double>(), 1e-3);
}

TEST(FsqNoiseDropout, FractionAndDistributionOfTheNoise) {
  // z = 0 gives code 0 (odd levels): every noisy element moves, by u ~ U[-0.5, 0.5).
  Fsq fsq(FsqOptions({5, 5, 5, 5}).preserve_symmetry(true).noise_dropout(0.2));
  const at::Tensor x = torch::zeros({4, 50000, 4});
  const at::Tensor q = noisy(fsq, x, 7).quantized;
  const at::Tensor moved = q != 0;
  const double fraction = moved.to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(fraction, 0.2, 0.005);  // ~25 sigma over 800k elements would be 0.011
  const at::Tensor u = q.masked_select(moved);
  EXPECT_LT(u.max().item<float>(), 0.5f);
  EXPECT_GE(u.min().item<float>(), -0.5f);
  EXPECT_NEAR(u.mean().item<float>(), 0.0, 0.005);
  EXPECT_NEAR(u.abs().mean().item<float>(), 0.25, 0.005);
  // Codes at +-1 are clamped back into [-1, 1].
  Fsq edge(FsqOptions({5}).preserve_symmetry(true).noise_dropout(0.9));
  const at::Tensor e = noisy(edge, torch::full({1, 20000, 1}, 20.0f), 8).quantized;
  EXPECT_EQ(e.max().item<float>(), 1.0f);
  EXPECT_GE(e.min().item<float>(), 0.5f);
}

TEST(QuantizerRegistry, BuildsByNameAndListsNamesForUnknownOnes) {
  // The other fsq keys at their declared defaults.
  const OptionReader options = default_option_reader("fsq", {{"fsq.levels", std::vector<int64_t>{7, 5}}});
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
