#include "lockstep/quant/vq.h"
#include "quant/torch_op_paths.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "lockstep/core/error.h"
#include "lockstep/quant/registry.h"
#include "recording_reducer.h"
#include "seeded.h"

namespace lockstep::quant {
namespace {

void set_buffer(Vq& vq, const std::string& name, const at::Tensor& value) {
  torch::NoGradGuard no_grad;
  vq.named_buffers()[name].copy_(value);
}

std::map<std::string, at::Tensor> snapshot(Vq& vq) {
  std::map<std::string, at::Tensor> out;
  for (const auto& b : vq.named_buffers()) out[b.key()] = b.value().clone();
  return out;
}

using test_util::seeded;

class VqEstimators : public ::testing::TestWithParam<std::tuple<bool, VqEstimator>> {};

TEST_P(VqEstimators, DecodeOfEncodeIsTheForwardValue) {
  const auto [cosine, estimator] = GetParam();
  Vq vq(VqOptions(6, 37).use_cosine_sim(cosine).estimator(estimator), seeded(1));
  torch::manual_seed(2);
  const at::Tensor x = torch::randn({3, 20, 6}, torch::requires_grad());
  const at::Tensor indices = vq.encode(x);
  const at::Tensor decoded = vq.decode(indices);  // before the training call moves the codebook
  test_util::RecordingReducer reducer;
  const QuantizerOutput out = vq.quantize(x, {&reducer, seeded(3)});
  ASSERT_EQ(out.indices.sizes(), (std::vector<int64_t>{3, 20}));
  EXPECT_GE(out.indices.min().item<int64_t>(), 0);
  EXPECT_LT(out.indices.max().item<int64_t>(), 37);
  EXPECT_TRUE(torch::equal(out.indices, indices));
  EXPECT_TRUE(torch::allclose(out.quantized, decoded, 1e-5, 1e-5));
  if (cosine) {
    EXPECT_TRUE(torch::allclose(decoded.norm(2, -1), torch::ones({3, 20}), 1e-5, 1e-5));
  }
  EXPECT_EQ(reducer.tags, std::vector<std::string>{"vq.ema"});
  // Commitment: mse(q, x) with the default weight 1, x of unit length under cosine similarity (as
  // the reference, which normalises the tokens before the codebook sees them).
  const at::Tensor tokens = cosine ? x.detach() / x.detach().norm(2, -1, true).clamp_min(1e-6) : x.detach();
  EXPECT_NEAR(out.losses.at("commitment").item<float>(), (decoded - tokens).pow(2).mean().item<float>(), 1e-5);
  out.total_loss().backward();
  EXPECT_TRUE(x.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(All, VqEstimators,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(VqEstimator::StraightThrough,
                                                                                 VqEstimator::RotationTrick)));

// A codebook larger than any machine's memory is refused before allocating, saying what and how much.
TEST(Vq, ACodebookBeyondMemoryIsRefusedBeforeAllocating) {
  try {
    Vq vq(VqOptions(1 << 20, 1 << 20));
    FAIL() << "a 16 TiB codebook was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("vq: 1 codebook(s) of 1048576 codes of dimension 1048576 needs 16384.0 GiB"),
              std::string::npos)
        << e.what();
  }
}

TEST(Vq, DefaultEstimatorIsTheRotationTrickAboveOneDimension) {
  EXPECT_EQ(VqOptions(2, 4).estimator(), VqEstimator::RotationTrick);
  EXPECT_EQ(VqOptions(1, 4).estimator(), VqEstimator::StraightThrough);
}

TEST(Vq, StraightThroughGradientIsTheIdentity) {
  Vq vq(VqOptions(4, 8).estimator(VqEstimator::StraightThrough).commitment_weight(0), seeded(1));
  const at::Tensor x = torch::randn({2, 5, 4}, torch::requires_grad());
  const at::Tensor upstream = torch::randn({2, 5, 4});
  (vq.quantize(x, {}).quantized * upstream).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), upstream, 0, 1e-6));
}

TEST(Vq, RotationTrickValueIsTheCodeAndItsGradientIsTheRotation) {
  const at::Tensor x = torch::tensor({{1.0f, 2.0f, -0.5f}, {0.3f, -1.0f, 2.0f}}, torch::requires_grad());
  const at::Tensor q = torch::tensor({{0.5f, 1.0f, 1.0f}, {-2.0f, 0.1f, 0.4f}});
  const at::Tensor out = rotate_to(x, q);
  EXPECT_TRUE(torch::allclose(out, q, 1e-5, 1e-6)) << out;
  const at::Tensor g = torch::tensor({{0.7f, -0.2f, 1.1f}, {0.4f, 0.9f, -0.6f}});
  (out * g).sum().backward();
  // out = s (I - 2 w w^T + 2 q^ u^T) x with s = |q|/|x|, u = x/|x|, q^ = q/|q|, w = (u+q^)/|u+q^|
  // constant, so dL/dx = s (g - 2 (g.w) w + 2 (g.q^) u). Computed here in double.
  const at::Tensor xd = x.detach().to(torch::kFloat64), qd = q.to(torch::kFloat64), gd = g.to(torch::kFloat64);
  const at::Tensor u = xd / xd.norm(2, 1, true), qh = qd / qd.norm(2, 1, true);
  const at::Tensor w = (u + qh) / (u + qh).norm(2, 1, true);
  const at::Tensor s = qd.norm(2, 1, true) / xd.norm(2, 1, true);
  const at::Tensor expected = s * (gd - 2 * (gd * w).sum(1, true) * w + 2 * (gd * qh).sum(1, true) * u);
  EXPECT_TRUE(torch::allclose(x.grad().to(torch::kFloat64), expected, 1e-5, 1e-6)) << x.grad() << expected;
}

// The rotation trick in torch ops with the reference's clamps, to check the fused one against; except
// that a token below the clamp gives its code, straight through (the reference gives 0: no code).
at::Tensor rotate_to_reference(const at::Tensor& x, const at::Tensor& q) {
  auto normalize = [](const at::Tensor& t) { return t / t.norm(2, -1, true).clamp_min(1e-6); };
  const at::Tensor norm_x = x.norm(2, -1, true), norm_q = q.norm(2, -1, true);
  const at::Tensor u = normalize(x).detach(), q_hat = normalize(q).detach();
  const at::Tensor w = normalize(u + q_hat).detach();
  const at::Tensor rotated = x - 2 * (x * w).sum(-1, true) * w + 2 * (x * u).sum(-1, true) * q_hat;
  return torch::where(norm_x < 1e-6, q + (x - x.detach()), rotated * (norm_q / norm_x.clamp_min(1e-6)).detach());
}

TEST(Vq, FusedRotationTrickMatchesTheTorchOpFormIncludingDegenerateRows) {
  torch::manual_seed(11);
  // Not d = 1: there u + q^ is 0 or a rounding error for every opposite pair, and w its normalisation
  // (VQ uses straight-through at d = 1).
  for (const int64_t d : {2, 3, 64, 67}) {
    at::Tensor x = torch::randn({2000, d});
    at::Tensor q = torch::randn({2000, d});
    x[0].zero_();     // zero token
    x[1].mul_(1e-8);  // below the clamp
    q[2].zero_();     // zero code
    q[3] = -x[3];     // opposite: u + q^ = 0
    const at::Tensor g = torch::randn({2000, d});
    const at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_(), xc = x.clone().requires_grad_();
    const at::Tensor fused = rotate_to(xa, q), reference = rotate_to_reference(xb, q);
    const at::Tensor off_cpu = detail::rotate_to_torch(xc, q);  // the path other devices run
    EXPECT_TRUE(torch::allclose(fused, reference, 1e-4, 1e-4)) << "d = " << d << " " << (fused - reference).abs().max();
    EXPECT_TRUE(torch::allclose(off_cpu, reference, 1e-4, 1e-4))
        << "d = " << d << " " << (off_cpu - reference).abs().max();
    (fused * g).sum().backward();
    (reference * g).sum().backward();
    (off_cpu * g).sum().backward();
    EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-4, 1e-4))
        << "d = " << d << " " << (xa.grad() - xb.grad()).abs().max();
    EXPECT_TRUE(torch::allclose(xc.grad(), xb.grad(), 1e-4, 1e-4))
        << "d = " << d << " " << (xc.grad() - xb.grad()).abs().max();
    // The zero token and the one below the clamp: the code's value, the gradient unchanged.
    for (int64_t row : {0, 1}) {
      EXPECT_TRUE(torch::equal(fused[row], q[row])) << "d = " << d << ", row " << row;
      EXPECT_TRUE(torch::equal(xa.grad()[row], g[row])) << "d = " << d << ", row " << row;
    }
  }
}

TEST(Vq, EmaUpdateWithLaplaceSmoothingMatchesHandComputedValues) {
  Vq vq(VqOptions(2, 2).decay(0.5), seeded(1));
  set_buffer(vq, "embed", torch::tensor({{{0.0f, 0.0f}, {10.0f, 10.0f}}}));
  set_buffer(vq, "embed_avg", torch::tensor({{{0.0f, 0.0f}, {10.0f, 10.0f}}}));
  // Tokens (1,1), (3,3) -> code 0 and (9,9) -> code 1: n = [2, 1], s = [[4,4], [9,9]].
  const at::Tensor x = torch::tensor({{1.0f, 1.0f}, {3.0f, 3.0f}, {9.0f, 9.0f}}).unsqueeze(0);
  const QuantizerOutput out = vq.quantize(x, {});
  EXPECT_TRUE(torch::equal(out.indices, torch::tensor({{0, 0, 1}}, torch::kInt64)));
  // N = lerp([1, 1], [2, 1], 0.5) = [1.5, 1]; m = lerp([[0,0],[10,10]], s, 0.5) = [[2,2],[9.5,9.5]];
  // N~ = (N + 1e-5) / (2.5 + 2e-5) * 2.5 = [1.499998, 1.000002]; e = m / N~ = [1.3333351, 9.499981].
  EXPECT_TRUE(torch::allclose(vq.cluster_size()[0], torch::tensor({1.5f, 1.0f}), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(vq.embed_avg()[0], torch::tensor({{2.0f, 2.0f}, {9.5f, 9.5f}}), 0, 1e-6));
  EXPECT_TRUE(
      torch::allclose(vq.embed()[0], torch::tensor({{1.3333351f, 1.3333351f}, {9.499981f, 9.499981f}}), 0, 2e-6))
      << vq.embed();
}

// affine_param by hand: the first call searches unmoved and sets the statistics (then the EMA sums
// the tokens moved into the codebook's frame); the next call searches the moved codebook.
TEST(Vq, AffineParamSearchesTheCodebookMovedToTheBatchStatistics) {
  Vq vq(VqOptions(1, 2)
            .decay(0.5)
            .affine_param(true)
            .affine_param_batch_decay(0.5)
            .affine_param_codebook_decay(0.5)
            .estimator(VqEstimator::StraightThrough),
        seeded(1));
  set_buffer(vq, "embed", torch::tensor({{{-1.0f}, {1.0f}}}));  // codebook mean 0, variance 1
  set_buffer(vq, "embed_avg", torch::tensor({{{-1.0f}, {1.0f}}}));
  // Batch 10, 12, 14, 16: mean 13, variance 5. Unmoved, every token is nearest code 1.
  const at::Tensor x = torch::tensor({10.0f, 12.0f, 14.0f, 16.0f}).reshape({1, 4, 1});
  test_util::RecordingReducer reducer;
  const QuantizerOutput first = vq.quantize(x, {&reducer, seeded(2)});
  EXPECT_TRUE(torch::equal(first.indices, torch::ones({1, 4}, torch::kInt64)));
  EXPECT_EQ(reducer.tags, (std::vector<std::string>{"vq.affine", "vq.ema"}));
  const auto buffer = [&](const std::string& name) { return vq.named_buffers()[name].item<float>(); };
  EXPECT_NEAR(buffer("batch_mean"), 13.0f, 1e-5);
  EXPECT_NEAR(buffer("batch_variance"), 5.0f, 1e-5);
  EXPECT_NEAR(buffer("codebook_mean"), 0.0f, 1e-6);
  EXPECT_NEAR(buffer("codebook_variance"), 1.0f, 1e-6);
  EXPECT_EQ(buffer("affine_initted"), 1.0f);
  // The EMA summed the tokens moved to the codebook's frame, (x - 13) / sqrt(5): their mean is 0.
  EXPECT_NEAR(vq.embed_avg()[0][1].item<float>(), 0.5f * 1.0f + 0.5f * 0.0f, 1e-5);
  // The moved codes are (e - 0) * sqrt(5) / 1 + 13: code 0 near 13 - sqrt(5) x e_0, code 1 above.
  const at::Tensor e = vq.embed()[0].squeeze(1);
  const at::Tensor moved = e * std::sqrt(5.0f) + 13.0f;
  const at::Tensor y = torch::tensor({8.0f, 13.0f, 20.0f}).reshape({1, 3, 1});
  const at::Tensor expected = (y.reshape({3, 1}) - moved.reshape({1, 2})).abs().argmin(1).reshape({1, 3});
  EXPECT_TRUE(torch::equal(vq.encode(y), expected)) << vq.encode(y) << expected;
  vq.eval();
  const QuantizerOutput second = vq.quantize(y, {});
  EXPECT_TRUE(torch::allclose(second.quantized.reshape(-1), moved.index_select(0, expected.reshape(-1)), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(vq.decode(second.indices), second.quantized, 0, 0)) << "decoding takes the moved codes";
}

TEST(Vq, EvaluationChangesNoStateAndCallsNoReducer) {
  Vq vq(VqOptions(4, 16).threshold_ema_dead_code(2.0), seeded(1));
  vq.eval();
  const auto before = snapshot(vq);
  test_util::RecordingReducer reducer;
  vq.quantize(torch::randn({2, 9, 4}), {&reducer, seeded(2)});
  EXPECT_TRUE(reducer.tags.empty());
  for (const auto& [name, value] : snapshot(vq)) EXPECT_TRUE(torch::equal(value, before.at(name))) << name;
}

TEST(Vq, ReducesExactlyOncePerTrainingCallEvenForAnEmptyBatch) {
  Vq vq(VqOptions(4, 16).threshold_ema_dead_code(0.9), seeded(1));
  test_util::RecordingReducer reducer;
  const QuantizerOutput out = vq.quantize(torch::randn({0, 7, 4}, torch::requires_grad()), {&reducer, seeded(2)});
  const std::vector<std::string> per_call = {"vq.ema", "vq.dead_code.samples"};
  EXPECT_EQ(reducer.tags, per_call);
  EXPECT_EQ(reducer.first_totals, std::vector<double>{0.0});
  EXPECT_EQ(out.indices.sizes(), (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(out.losses.at("commitment").item<float>(), 0.0f);
  vq.quantize(torch::randn({3, 7, 4}), {&reducer, seeded(3)});
  EXPECT_EQ(reducer.tags.size(), 4u);
  EXPECT_EQ(reducer.first_totals.back(), 21.0);
}

TEST(Vq, KmeansInitLowersInertiaOnClusteredData) {
  torch::manual_seed(5);
  const at::Tensor centers = torch::randn({8, 4}) * 10;
  const at::Tensor x = (centers.repeat({64, 1}) + torch::randn({512, 4}) * 0.1).unsqueeze(0);
  auto inertia = [&](Vq& vq) {
    return nearest_code(x[0], vq.embed()[0], Metric::Euclidean).score.mean().item<float>();
  };
  Vq random_init(VqOptions(4, 8), seeded(1));
  Vq kmeans(VqOptions(4, 8).kmeans_init(true).kmeans_iters(10), seeded(1));
  EXPECT_FALSE(kmeans.initted());
  test_util::RecordingReducer reducer;
  random_init.quantize(x, {});
  kmeans.quantize(x, {&reducer, seeded(2)});
  EXPECT_TRUE(kmeans.initted());
  EXPECT_EQ(reducer.tags.size(), 12u);
  EXPECT_EQ(reducer.tags.front(), "vq.kmeans.samples");
  EXPECT_EQ(reducer.tags[1], "vq.kmeans");
  EXPECT_EQ(reducer.tags.back(), "vq.ema");
  // Each call names the quantizer's own source line (vq*.cpp), which fingerprints and reports then show.
  for (const auto& file : reducer.files) EXPECT_NE(file.find("src/quant/vq"), std::string::npos) << file;
  EXPECT_LT(inertia(kmeans), 0.5f * inertia(random_init)) << inertia(kmeans) << " vs " << inertia(random_init);
  EXPECT_NEAR(kmeans.cluster_size().sum().item<float>(), 512.0f, 1e-2);
  kmeans.quantize(x, {&reducer, seeded(3)});  // initialised once only
  EXPECT_EQ(reducer.tags.size(), 13u);
}

TEST(Vq, DeadCodesAreReplacedByBatchVectors) {
  // Every token lands on one code; the others decay to N = 0.8 < 0.9 and are replaced.
  Vq vq(VqOptions(3, 16).threshold_ema_dead_code(0.9), seeded(1));
  const at::Tensor x = (torch::full({1, 3}, 50.0f) + torch::randn({40, 3})).unsqueeze(0);
  const QuantizerOutput out = vq.quantize(x, {nullptr, seeded(4)});
  const int64_t used = out.indices[0][0].item<int64_t>();
  ASSERT_TRUE((out.indices == used).all().item<bool>());
  for (int64_t k = 0; k < 16; ++k) {
    if (k == used) continue;
    EXPECT_FLOAT_EQ(vq.cluster_size()[0][k].item<float>(), 0.9f);
    const at::Tensor row = vq.embed()[0][k];
    EXPECT_TRUE((x[0] == row).all(1).any().item<bool>()) << "code " << k << " is not a batch vector";
    EXPECT_TRUE(torch::allclose(vq.embed_avg()[0][k], row * 0.9, 1e-6, 1e-5));
  }
}

// The Python modules defer the update to backward (G3): quantize changes no state and calls no
// reducer; the update it hands back, run once, leaves the state an eager call leaves.
TEST(Vq, ADeferredUpdateLeavesTheStateAnEagerCallLeaves) {
  const VqOptions options = VqOptions(4, 16).threshold_ema_dead_code(1.5);
  Vq eager(options, seeded(1)), deferred(options, seeded(1));
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({2, 30, 4});
  test_util::RecordingReducer eager_calls, deferred_calls;
  eager.quantize(x, {&eager_calls, seeded(5)});
  const auto before = snapshot(deferred);
  QuantizeContext ctx{&deferred_calls, seeded(5)};
  ctx.defer_updates = true;
  const QuantizerOutput out = deferred.quantize(x, ctx);
  EXPECT_TRUE(deferred_calls.tags.empty());
  for (const auto& [name, value] : snapshot(deferred)) EXPECT_TRUE(torch::equal(value, before.at(name))) << name;
  ASSERT_TRUE(static_cast<bool>(out.update));
  out.update(deferred_calls);
  EXPECT_EQ(deferred_calls.tags, eager_calls.tags);
  for (const auto& [name, value] : snapshot(eager))
    EXPECT_TRUE(torch::equal(snapshot(deferred).at(name), value)) << name;
  // A call that cannot be backwarded hands back no update.
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(static_cast<bool>(deferred.quantize(x, ctx).update));
}

// Padded sequences: masked tokens count in no statistic (k-means, EMA, dead codes) and no loss, so
// a padded batch trains the codebook exactly as its valid tokens packed into one sequence do, with
// the same collectives; the padding's outputs are 0 and its indices -1.
TEST(Vq, MaskedTokensCountInNoStatisticAndNoLoss) {
  const VqOptions options = VqOptions(4, 24).kmeans_init(true).threshold_ema_dead_code(1.5).heads(2).codebook_dim(2);
  Vq padded(options, seeded(1)), packed(options, seeded(1));
  torch::manual_seed(4);
  const at::Tensor lengths = torch::tensor({7, 0, 3}).unsqueeze(1);
  const at::Tensor mask = torch::arange(7).unsqueeze(0) < lengths;
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = torch::randn({3, 7, 4});
    test_util::RecordingReducer padded_calls, packed_calls;
    QuantizeContext ctx{&padded_calls, seeded(10 + step)};
    ctx.mask = mask;
    const QuantizerOutput out = padded.quantize(x, ctx);
    const QuantizerOutput ref = packed.quantize(x.index({mask}).unsqueeze(0), {&packed_calls, seeded(10 + step)});
    EXPECT_EQ(padded_calls.tags, packed_calls.tags);
    EXPECT_TRUE(torch::equal(out.indices.index({mask}), ref.indices[0])) << "step " << step;
    EXPECT_TRUE((out.indices.index({~mask}) == -1).all().item<bool>());
    EXPECT_TRUE((out.quantized.index({~mask}) == 0).all().item<bool>());
    EXPECT_TRUE(torch::allclose(out.losses.at("commitment"), ref.losses.at("commitment"), 1e-6, 1e-7));
    for (const auto& [name, value] : snapshot(packed))
      EXPECT_TRUE(torch::allclose(snapshot(padded).at(name), value, 1e-6, 1e-7)) << name << " at step " << step;
  }
  QuantizeContext wrong;
  wrong.mask = torch::ones({3, 6}, torch::kBool);
  EXPECT_THROW(padded.quantize(torch::randn({3, 7, 4}), wrong), InvalidArgument);
}

// code_logits: minus the distance (or the cosine similarity) to every code, whose argmax is encode's
// choice, laid out per head as the indices are.
TEST(Vq, CodeLogitsPeakAtTheEncodedCode) {
  for (const bool cosine : {false, true}) {
    Vq vq(VqOptions(6, 10).heads(2).separate_codebook_per_head(true).use_cosine_sim(cosine), seeded(2));
    const at::Tensor x = torch::randn({3, 4, 6});
    const at::Tensor logits = vq.code_logits(x);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{3, 4, 2, 10}));
    EXPECT_TRUE(torch::equal(logits.argmax(-1), vq.encode(x))) << "cosine " << cosine;
  }
  Vq vq(VqOptions(3, 5), seeded(3));
  const at::Tensor x = torch::randn({1, 2, 3});
  const at::Tensor expected = -torch::cdist(x[0], vq.embed()[0]);
  EXPECT_TRUE(torch::allclose(vq.code_logits(x)[0], expected, 1e-4, 1e-5));
}

// Top-k: the k nearest codes in order (the first the search's own), each code's loss its mean squared
// distance, -1 and 0 at masked tokens; nothing trained.
TEST(Vq, TopkGivesTheKNearestCodesInOrderAndTrainsNothing) {
  Vq vq(VqOptions(4, 10).estimator(VqEstimator::StraightThrough), seeded(1));
  const at::Tensor before = vq.embed().clone();
  const at::Tensor x = torch::randn({2, 7, 4});
  const at::Tensor mask = torch::ones({2, 7}, torch::kBool).index_put_({1, 3}, false);
  QuantizeContext ctx{nullptr, seeded(2)};
  ctx.mask = mask;
  const VqTopk top = vq.quantize_topk(x, 3, ctx);
  ASSERT_EQ(top.indices.sizes(), (std::vector<int64_t>{2, 7, 3}));
  ASSERT_EQ(top.quantized.sizes(), (std::vector<int64_t>{2, 7, 3, 4}));
  const at::Tensor distances = torch::cdist(x.reshape({14, 4}), vq.embed()[0]).reshape({2, 7, 10});
  const at::Tensor expected = std::get<1>(distances.topk(3, 2, /*largest=*/false));
  EXPECT_TRUE(torch::equal(top.indices.index({1, 3}), torch::full({3}, -1, torch::kInt64)));
  EXPECT_EQ(top.code_loss.index({1, 3}).abs().sum().item<float>(), 0.0f);
  for (int64_t i = 0; i < 14; ++i) {
    if (i == 10) continue;  // item 1, token 3: masked
    EXPECT_TRUE(torch::equal(top.indices.reshape({14, 3})[i], expected.reshape({14, 3})[i])) << "token " << i;
  }
  const at::Tensor codes = vq.decode(top.indices.clamp_min(0).reshape({2, 21})).reshape({2, 7, 3, 4});
  const at::Tensor losses = (x.unsqueeze(2) - codes).pow(2).mean(-1).masked_fill(mask.logical_not().unsqueeze(2), 0);
  EXPECT_TRUE(torch::allclose(top.code_loss, losses, 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(vq.encode(x).masked_fill(mask.logical_not(), -1), top.indices.select(2, 0)));
  EXPECT_TRUE(torch::equal(vq.embed(), before));
}

// update_from with the codes the search would choose is the training call's own update, the mask and
// -1 indices counting in nothing.
TEST(Vq, UpdateFromChosenCodesIsTheTrainingCallsUpdate) {
  const at::Tensor x = torch::randn({3, 20, 4});
  const at::Tensor mask = torch::rand({3, 20}) > 0.3;
  Vq trained(VqOptions(4, 12).decay(0.5), seeded(1));
  Vq chosen(VqOptions(4, 12).decay(0.5), seeded(1));
  QuantizeContext ctx{nullptr, seeded(2)};
  ctx.mask = mask;
  trained.quantize(x, ctx);
  QuantizeContext plain{nullptr, seeded(2)};
  // The masked tokens once by the mask, once by -1 indices: the same update.
  const at::Tensor indices = chosen.encode(x).masked_fill(mask.logical_not(), -1);
  chosen.update_from(x, indices, plain);
  EXPECT_TRUE(torch::allclose(chosen.cluster_size(), trained.cluster_size(), 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(chosen.embed(), trained.embed(), 1e-6, 1e-6));
  EXPECT_THROW(chosen.update_from(x, torch::full({3, 20}, 12, torch::kInt64), plain), InvalidArgument);
}

// VqUpdate: per-code weights keep a code of weight 0 as it was; accumulated statistics fold into the next
// update, which then equals one update with all of them.
TEST(Vq, PerCallUpdatesWeighAndAccumulate) {
  const at::Tensor x = torch::randn({2, 30, 4});
  const at::Tensor y = torch::randn({2, 30, 4});
  Vq weighed(VqOptions(4, 6).decay(0.5), seeded(1));
  VqUpdate half;
  half.weight = torch::tensor({1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f});
  weighed.quantize_with(x, {nullptr, seeded(2)}, half);
  for (int64_t k : {1, 3, 5}) EXPECT_EQ(weighed.cluster_size()[0][k].item<float>(), 1.0f) << k;
  Vq accumulated(VqOptions(4, 6).decay(0.5), seeded(1));
  Vq once(VqOptions(4, 6).decay(0.5), seeded(1));
  VqUpdate accumulate;
  accumulate.accumulate = true;
  const at::Tensor before = accumulated.embed().clone();
  accumulated.quantize_with(x, {nullptr, seeded(2)}, accumulate);
  EXPECT_TRUE(torch::equal(accumulated.embed(), before));
  accumulated.quantize(y, {nullptr, seeded(3)});
  once.update_from(torch::cat({x, y}, 1), torch::cat({once.encode(x), once.encode(y)}, 1), {nullptr, seeded(3)});
  EXPECT_TRUE(torch::allclose(accumulated.cluster_size(), once.cluster_size(), 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(accumulated.embed(), once.embed(), 1e-5, 1e-6));
}

TEST(Vq, StateRoundTripsThroughNamedBuffers) {
  Vq a(VqOptions(5, 12).threshold_ema_dead_code(0.5), seeded(1));
  for (int step = 0; step < 3; ++step) a.quantize(torch::randn({2, 30, 5}), {nullptr, seeded(step)});
  Vq b(VqOptions(5, 12).threshold_ema_dead_code(0.5), seeded(99));
  std::set<std::string> names;
  for (const auto& buffer : a.named_buffers()) {
    names.insert(buffer.key());
    set_buffer(b, buffer.key(), buffer.value());
  }
  EXPECT_EQ(names, (std::set<std::string>{"embed", "cluster_size", "embed_avg", "initted"}));
  for (const auto& [name, value] : snapshot(a)) EXPECT_TRUE(torch::equal(value, snapshot(b).at(name))) << name;
  const at::Tensor x = torch::randn({2, 10, 5});
  EXPECT_TRUE(torch::equal(a.encode(x), b.encode(x)));
  EXPECT_TRUE(torch::equal(a.decode(a.encode(x)), b.decode(b.encode(x))));
}

void expect_invalid(const VqOptions& options, const std::string& fragment) {
  try {
    Vq vq(options);
    FAIL() << "accepted; expected an error naming " << fragment;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Vq, InvalidOptionsNameTheValue) {
  expect_invalid(VqOptions(4, 0), "codebook_size = 0");
  expect_invalid(VqOptions(0, 8), "dim = 0");
  expect_invalid(VqOptions(4, 8).decay(1.25), "decay = 1.25");
  expect_invalid(VqOptions(4, 8).eps(0), "eps = 0");
  expect_invalid(VqOptions(4, 8).decay(-0.25), "decay = -0.25");
  expect_invalid(VqOptions(4, 8).kmeans_iters(0), "kmeans_iters = 0");
  expect_invalid(VqOptions(4, 8).heads(0), "heads = 0");
  expect_invalid(VqOptions(4, 8).codebook_dim(0), "codebook_dim = 0");
  expect_invalid(VqOptions(4, 8).orthogonal_reg_weight(-1), "orthogonal_reg_weight = -1");
  expect_invalid(VqOptions(4, 8).sample_codebook_temp(-0.5), "sample_codebook_temp = -0.5");
  expect_invalid(VqOptions(4, 8).learnable_codebook(true), "needs ema_update = false");
  expect_invalid(VqOptions(4, 8).learnable_codebook(true).ema_update(false).use_cosine_sim(true), "needs cosine");
  Vq vq(VqOptions(4, 8), seeded(1));
  EXPECT_THROW(vq.decode(torch::tensor({{8}}, torch::kInt64)), InvalidArgument);
  EXPECT_THROW(vq.quantize(torch::randn({2, 3, 5}), {}), InvalidArgument);
}

TEST(Vq, RegistryBuildsItFromOptionKeys) {
  OptionReader o;
  o.integer = [](const std::string& key) -> int64_t {
    if (key == "dim") return 6;
    if (key == "codebook_size") return 20;
    if (key == "kmeans_iters") return 3;
    if (key == "heads") return 2;
    if (key == "codebook_dim") return 0;  // 0: dim
    if (key == "orthogonal_reg_max_codes") return 4;
    throw InvalidArgument("unknown key " + key);
  };
  o.real = [](const std::string& key) -> double {
    if (key == "decay") return 0.9;
    if (key == "eps") return 1e-3;
    if (key == "commitment_weight") return 0.25;
    if (key == "threshold_ema_dead_code") return 0.0;
    if (key == "orthogonal_reg_weight") return 0.5;
    if (key == "sample_codebook_temp") return 0.7;
    if (key == "affine_param_batch_decay") return 0.8;
    if (key == "affine_param_codebook_decay") return 0.6;
    if (key == "directional_reparam_variance") return 0.02;
    if (key == "sync_update_v") return 0.25;
    if (key == "codebook_diversity_loss_weight") return 0.3;
    if (key == "codebook_diversity_temperature") return 50.0;
    throw InvalidArgument("unknown key " + key);
  };
  o.boolean = [](const std::string& key) -> bool {
    if (key == "cosine" || key == "kmeans_init" || key == "directional_reparam") return false;
    if (key == "layernorm_after_project_in") return true;
    if (key == "route_gradients_to_input") return false;
    if (key == "rotation_trick" || key == "stochastic_sample_codes") return false;
    if (key == "separate_codebook_per_head" || key == "learnable_codebook") return true;
    if (key == "ema_update") return false;
    if (key == "affine_param") return true;
    if (key == "manual_ema_update") return true;
    if (key == "orthogonal_reg_active_codes_only") return false;  // true needs one codebook
    throw InvalidArgument("unknown key " + key);
  };
  const auto q = make_quantizer("vq", o);
  ASSERT_EQ(q->kind(), "vq");
  const auto& vq = dynamic_cast<const Vq&>(*q);
  EXPECT_EQ(vq.dim(), 6);
  EXPECT_EQ(vq.codebook_size(), 20);
  EXPECT_DOUBLE_EQ(vq.options().decay(), 0.9);
  EXPECT_DOUBLE_EQ(vq.options().eps(), 1e-3);
  EXPECT_DOUBLE_EQ(vq.options().commitment_weight(), 0.25);
  EXPECT_EQ(vq.options().kmeans_iters(), 3);
  EXPECT_EQ(vq.options().estimator(), VqEstimator::StraightThrough);
  EXPECT_EQ(vq.options().heads(), 2);
  EXPECT_EQ(vq.options().codebook_dim(), 6);
  EXPECT_TRUE(vq.options().separate_codebook_per_head());
  EXPECT_DOUBLE_EQ(vq.options().orthogonal_reg_weight(), 0.5);
  EXPECT_DOUBLE_EQ(vq.options().codebook_diversity_loss_weight(), 0.3);
  EXPECT_DOUBLE_EQ(vq.options().codebook_diversity_temperature(), 50.0);
  EXPECT_DOUBLE_EQ(vq.options().sample_codebook_temp(), 0.7);
  EXPECT_TRUE(vq.options().learnable_codebook());
  EXPECT_FALSE(vq.options().ema_update());
  EXPECT_TRUE(vq.options().affine_param());
  EXPECT_DOUBLE_EQ(vq.options().affine_param_batch_decay(), 0.8);
  EXPECT_DOUBLE_EQ(vq.options().affine_param_codebook_decay(), 0.6);
  EXPECT_DOUBLE_EQ(vq.options().directional_reparam_variance(), 0.02);
  EXPECT_DOUBLE_EQ(vq.options().sync_update_v(), 0.25);
  EXPECT_FALSE(vq.options().route_gradients_to_input());
  EXPECT_TRUE(vq.options().layernorm_after_project_in());
  EXPECT_EQ(vq.options().orthogonal_reg_max_codes(), 4);
  EXPECT_TRUE(vq.options().manual_ema_update());
}

// learnable_codebook: the codebook is a parameter that only the commitment loss moves (the
// gradient of |x - e_k|^2 reaches e_k); a training call keeps no statistics and reduces nothing.
TEST(Vq, ALearnableCodebookIsTrainedByTheCommitmentLossAlone) {
  Vq vq(VqOptions(3, 5).learnable_codebook(true).ema_update(false).estimator(VqEstimator::StraightThrough), seeded(1));
  ASSERT_TRUE(vq.embed().requires_grad());
  const at::Tensor before = vq.embed().detach().clone();
  torch::manual_seed(2);
  const at::Tensor x = torch::randn({2, 4, 3}).requires_grad_(true);
  test_util::RecordingReducer calls;
  const QuantizerOutput out = vq.quantize(x, {&calls, seeded(3)});
  EXPECT_TRUE(calls.tags.empty());
  EXPECT_TRUE(torch::equal(vq.embed().detach(), before));  // no EMA
  out.quantized.sum().backward();                          // the output's gradient stays with the input
  EXPECT_FALSE(vq.embed().grad().defined() && vq.embed().grad().abs().sum().item<float>() > 0);
  out.losses.at("commitment").backward();
  const at::Tensor idx = out.indices.reshape(-1);
  const at::Tensor tokens = x.detach().reshape({-1, 3});
  at::Tensor expected = torch::zeros({5, 3});
  expected.index_add_(0, idx, 2 * (before[0].index_select(0, idx) - tokens) / tokens.numel());
  EXPECT_TRUE(torch::allclose(vq.embed().grad()[0], expected, 1e-5, 1e-6));
  // ema_update = false alone: the codebook is a buffer nothing moves.
  Vq frozen(VqOptions(3, 5).ema_update(false), seeded(1));
  const at::Tensor kept = frozen.embed().clone();
  test_util::RecordingReducer none;
  frozen.quantize(x.detach(), {&none, seeded(3)});
  EXPECT_TRUE(torch::equal(frozen.embed(), kept));
  EXPECT_TRUE(none.tags.empty());
}

// Brute-force nearest code of each row of x (n, d) in codebook (K, d).
at::Tensor brute_nearest(const at::Tensor& x, const at::Tensor& codebook) {
  return torch::cdist(x.unsqueeze(0), codebook.unsqueeze(0)).squeeze(0).argmin(1);
}

TEST(Vq, SharedCodebookHeadsQuantizeEachHalfOfTheTokenWithTheSameCodes) {
  Vq vq(VqOptions(8, 16).heads(2).codebook_dim(4).estimator(VqEstimator::StraightThrough), seeded(1));
  ASSERT_EQ(vq.embed().sizes(), (std::vector<int64_t>{1, 16, 4}));
  EXPECT_EQ(vq.named_parameters().size(), 0u);  // 2 x 4 == 8: no projection
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({2, 5, 8}, torch::requires_grad());
  const at::Tensor codes = vq.embed()[0].clone();
  const at::Tensor encoded = vq.encode(x);
  const at::Tensor decoded = vq.decode(encoded);
  const QuantizerOutput out = vq.quantize(x, {});
  ASSERT_EQ(out.indices.sizes(), (std::vector<int64_t>{2, 5, 2}));
  EXPECT_TRUE(torch::equal(out.indices, encoded));
  const at::Tensor halves = x.detach().reshape({2, 5, 2, 4});
  for (int64_t h = 0; h < 2; ++h) {
    const at::Tensor expected = brute_nearest(halves.select(2, h).reshape({-1, 4}), codes);
    EXPECT_TRUE(torch::equal(out.indices.select(2, h).flatten(), expected)) << "head " << h;
  }
  EXPECT_TRUE(torch::allclose(out.quantized, decoded, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(decoded.reshape({2, 5, 2, 4}),
                              codes.index_select(0, out.indices.flatten()).reshape({2, 5, 2, 4}), 0, 0));
  // Both heads' tokens count in the one EMA: 2 * 5 * 2 = 20 assignments.
  EXPECT_NEAR(vq.cluster_size().sum().item<float>(), 0.8 * 16 + 0.2 * 20, 1e-4);
}

TEST(Vq, SeparateCodebooksPerHeadUseTheirOwnCodesAndOneReduction) {
  Vq vq(VqOptions(6, 9).heads(3).codebook_dim(2).separate_codebook_per_head(true), seeded(1));
  ASSERT_EQ(vq.embed().sizes(), (std::vector<int64_t>{3, 9, 2}));
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({4, 7, 6});
  const at::Tensor codes = vq.embed().clone();
  test_util::RecordingReducer reducer;
  const QuantizerOutput out = vq.quantize(x, {&reducer, seeded(2)});
  EXPECT_EQ(reducer.tags, std::vector<std::string>{"vq.ema"});
  EXPECT_EQ(reducer.first_totals, std::vector<double>{3 * 28.0});  // every head's counts in one tensor
  ASSERT_EQ(out.indices.sizes(), (std::vector<int64_t>{4, 7, 3}));
  const at::Tensor heads = x.reshape({4, 7, 3, 2});
  for (int64_t h = 0; h < 3; ++h) {
    const at::Tensor expected = brute_nearest(heads.select(2, h).reshape({-1, 2}), codes[h]);
    EXPECT_TRUE(torch::equal(out.indices.select(2, h).flatten(), expected)) << "head " << h;
    // Each codebook's EMA counted its own 28 tokens.
    EXPECT_NEAR(vq.cluster_size()[h].sum().item<float>(), 0.8 * 9 + 0.2 * 28, 1e-4) << "head " << h;
  }
  vq.eval();
  EXPECT_TRUE(torch::allclose(vq.decode(vq.encode(x)), vq.quantize(x, {}).quantized, 1e-6, 1e-6));
}

TEST(Vq, CodebookDimAddsProjectionsThatLearn) {
  Vq vq(VqOptions(6, 10).codebook_dim(3), seeded(1));
  ASSERT_EQ(vq.embed().sizes(), (std::vector<int64_t>{1, 10, 3}));
  std::set<std::string> names;
  for (const auto& p : vq.named_parameters()) names.insert(p.key());
  EXPECT_EQ(names,
            (std::set<std::string>{"project_in.weight", "project_in.bias", "project_out.weight", "project_out.bias"}));
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({2, 8, 6}, torch::requires_grad());
  vq.eval();
  const QuantizerOutput out = vq.quantize(x, {});
  EXPECT_TRUE(torch::allclose(out.quantized, vq.decode(vq.encode(x)), 1e-5, 1e-5));
  (out.quantized.pow(2).sum() + out.total_loss()).backward();
  for (const auto& p : vq.named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<float>(), 0) << p.key();
  }
  EXPECT_GT(x.grad().abs().sum().item<float>(), 0);
}

TEST(Vq, OrthogonalLossMatchesTheExplicitCosineMatrix) {
  Vq vq(VqOptions(5, 7).orthogonal_reg_weight(2.5), seeded(3));
  const at::Tensor before = vq.embed().clone();
  const QuantizerOutput out = vq.quantize(torch::randn({1, 4, 5}), {});
  // The loss is taken on the codebook as this call's EMA step left it, as the reference reports it.
  ASSERT_FALSE(torch::equal(vq.embed(), before));
  const at::Tensor e = vq.embed()[0].to(torch::kFloat64);
  const at::Tensor normed = e / e.norm(2, 1, true);
  const at::Tensor cos = torch::matmul(normed, normed.t());
  const double expected = (cos.pow(2).sum().item<double>() / 49.0 - 1.0 / 7.0) * 2.5;
  EXPECT_NEAR(out.losses.at("orthogonal").item<double>(), expected, 1e-5);
  // The codebook is a parameter the regulariser trains (as in the reference), its gradient taken at
  // the codebook as it is when backward runs.
  ASSERT_TRUE(vq.embed().requires_grad());
  EXPECT_EQ(vq.named_parameters().size(), 1u);
  out.losses.at("orthogonal").backward();
  const at::Tensor leaf = vq.embed().detach().clone().requires_grad_(true);
  const at::Tensor unit = leaf[0] / leaf[0].norm(2, 1, true);
  ((torch::matmul(unit, unit.t()).pow(2).sum() / 49.0 - 1.0 / 7.0) * 2.5).backward();
  EXPECT_TRUE(torch::allclose(vq.embed().grad(), leaf.grad(), 1e-4, 1e-6))
      << (vq.embed().grad() - leaf.grad()).abs().max();
  Vq off(VqOptions(5, 7), seeded(3));
  EXPECT_EQ(off.named_parameters().size(), 0u);
  EXPECT_EQ(off.quantize(torch::randn({1, 4, 5}), {}).losses.count("orthogonal"), 0u);
}

TEST(Vq, StochasticSamplingDrawsFromTheSoftmaxWithTheCallersGenerator) {
  // Every token is 0; codes at 1 and 2: logits -1 and -2, so P(code 0) = 1 / (1 + e^-1) = 0.7311.
  auto make = [] {
    Vq vq(VqOptions(1, 2).stochastic_sample_codes(true).decay(0.99), seeded(1));
    torch::NoGradGuard no_grad;
    vq.named_buffers()["embed"].copy_(torch::tensor({1.0f, 2.0f}).reshape({1, 2, 1}));
    return vq;
  };
  Vq a = make();
  const at::Tensor x = torch::zeros({1, 20000, 1});
  const at::Tensor first = a.quantize(x, {nullptr, seeded(7)}).indices;
  const double frac0 = (first == 0).to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(frac0, 0.7311, 0.015);
  Vq b = make();
  EXPECT_TRUE(torch::equal(b.quantize(x, {nullptr, seeded(7)}).indices, first));  // same generator, same draw
  Vq c = make();
  EXPECT_FALSE(torch::equal(c.quantize(x, {nullptr, seeded(8)}).indices, first));
  // Evaluation and encode take the nearest code.
  Vq d = make();
  d.eval();
  EXPECT_TRUE((d.quantize(x, {nullptr, seeded(7)}).indices == 0).all().item<bool>());
  EXPECT_TRUE((d.encode(x) == 0).all().item<bool>());
}

}  // namespace
}  // namespace lockstep::quant
