#include "lockstep/quant/residual.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "lockstep/core/error.h"
#include "lockstep/quant/initialisation.h"
#include "recording_reducer.h"
#include "seeded.h"

namespace lockstep::quant {
namespace {

using test_util::seeded;

TEST(Residual, VqLayersQuantizeWhatThePreviousLayersLeft) {
  auto rvq = make_residual_vq(ResidualOptions(3), VqOptions(4, 16), seeded(1));
  ASSERT_EQ(rvq->kind(), "residual-vq");
  ASSERT_EQ(rvq->num_indices(), 3);
  rvq->eval();
  torch::manual_seed(2);
  const at::Tensor x = torch::randn({2, 6, 4});
  const QuantizerOutput out = rvq->quantize(x, {});
  ASSERT_EQ(out.indices.sizes(), (std::vector<int64_t>{2, 6, 3}));
  // By hand: r0 = x, i_l = nearest code of r_{l-1} in layer l, r_l = r_{l-1} - e_l[i_l].
  at::Tensor residual = x;
  at::Tensor sum = torch::zeros_like(x);
  for (int64_t l = 0; l < 3; ++l) {
    Quantizer& layer = *rvq->layers()[l];
    const at::Tensor idx = layer.encode(residual);
    EXPECT_TRUE(torch::equal(out.indices.select(2, l), idx)) << "layer " << l;
    const at::Tensor q = layer.decode(idx);
    residual = residual - q;
    sum = sum + q;
  }
  EXPECT_TRUE(torch::allclose(out.quantized, sum, 1e-6, 1e-6));
  EXPECT_EQ(out.losses.size(), 3u);
  EXPECT_TRUE(out.losses.count("layer2.commitment"));
}

TEST(Residual, MoreLayersLeaveLessErrorAfterTraining) {
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({4, 64, 4});
  auto error_with = [&](int64_t layers) {
    auto rvq = make_residual_vq(ResidualOptions(layers), VqOptions(4, 32).kmeans_init(true), seeded(4));
    for (int step = 0; step < 5; ++step) rvq->quantize(x, {nullptr, seeded(10 + step)});
    rvq->eval();
    return (rvq->quantize(x, {}).quantized - x).pow(2).mean().item<float>();
  };
  const float one = error_with(1), three = error_with(3);
  EXPECT_LT(three, 0.5f * one) << three << " vs " << one;
}

// A caller that splits a batch into passes (train.shard_size) asks first: every layer's k-means must
// see the whole batch, and once a training call ran it, none waits.
TEST(Residual, AwaitsInitialisationUntilItsLayersKMeansRan) {
  auto plain = make_residual_vq(ResidualOptions(2), VqOptions(4, 8), seeded(1));
  EXPECT_FALSE(awaits_initialisation(*plain));
  auto rvq = make_residual_vq(ResidualOptions(2), VqOptions(4, 8).kmeans_init(true), seeded(1));
  EXPECT_TRUE(awaits_initialisation(*rvq));
  const at::Tensor x = torch::randn({2, 16, 4}, seeded(2));
  rvq->eval();
  rvq->quantize(x, {nullptr, seeded(3)});
  EXPECT_TRUE(awaits_initialisation(*rvq)) << "an evaluation call initialises nothing";
  rvq->train();
  rvq->quantize(x, {nullptr, seeded(3)});
  EXPECT_FALSE(awaits_initialisation(*rvq));
  EXPECT_TRUE(awaits_initialisation(Vq(VqOptions(4, 8).kmeans_init(true), seeded(1))));
  EXPECT_FALSE(awaits_initialisation(*make_residual_fsq(ResidualOptions(2), FsqOptions({5, 4}))));
}

// A residual FSQ over levels {5, 4} with two layers, each `layer`: layer 0 quantizes z, layer 1 the
// residual scaled by levels^-1; `out` must hold their indices and the sum of their codes.
void expect_two_fsq_layers(const QuantizerOutput& out, Fsq layer, const at::Tensor& z) {
  const at::Tensor i0 = layer.encode(z);
  const at::Tensor q0 = layer.decode(i0);
  const at::Tensor scale1 = torch::tensor({1.0f / 5, 1.0f / 4});
  const at::Tensor i1 = layer.encode((z - q0) / scale1);
  EXPECT_TRUE(torch::equal(out.indices.select(2, 0), i0));
  EXPECT_TRUE(torch::equal(out.indices.select(2, 1), i1));
  EXPECT_TRUE(torch::allclose(out.quantized, q0 + layer.decode(i1) * scale1, 1e-6, 1e-6));
}

TEST(Residual, FsqLayersSeeTheResidualScaledByLevelsToTheLayer) {
  auto rfsq = make_residual_fsq(ResidualOptions(2), FsqOptions({5, 4}));
  ASSERT_EQ(rfsq->dim(), 2);
  ASSERT_EQ(rfsq->codebook_size(), 20);
  rfsq->eval();
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({1, 30, 2});
  const QuantizerOutput out = rfsq->quantize(x, {});
  expect_two_fsq_layers(out, Fsq(FsqOptions({5, 4}).preserve_symmetry(true)), x);
}

TEST(Residual, FsqWithHardClampedLayersSquashesTheInputFirst) {
  // The reference ResidualFSQ's default: z = tanh(x / c) * c with c = 1 + 1/(L-1), then layers
  // whose bound clamps; layer 1 sees (z - q0) / scale1.
  auto rfsq = make_residual_fsq(ResidualOptions(2), FsqOptions({5, 4}).bound_hard_clamp(true));
  rfsq->eval();
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({1, 30, 2}) * 2;
  const QuantizerOutput out = rfsq->quantize(x, {});
  const at::Tensor c = torch::tensor({1.0f + 1.0f / 4, 1.0f + 1.0f / 3});
  const at::Tensor z = (x / c).tanh() * c;
  expect_two_fsq_layers(out, Fsq(FsqOptions({5, 4}).preserve_symmetry(true).bound_hard_clamp(true)), z);
  EXPECT_TRUE(torch::equal(rfsq->encode(x), out.indices));
  // Without the option the input is not squashed: some token quantizes differently.
  auto plain = make_residual_fsq(ResidualOptions(2), FsqOptions({5, 4}));
  EXPECT_FALSE(torch::equal(plain->encode(x), out.indices));
}

TEST(Residual, LfqLayersHalveTheCodebookScale) {
  auto rlfq = make_residual_lfq(ResidualOptions(3), LfqOptions(8).codebook_scale(1.5));
  ASSERT_EQ(rlfq->dim(), 3);
  for (int64_t l = 0; l < 3; ++l) {
    const auto& layer = dynamic_cast<const Lfq&>(*rlfq->layers()[l]);
    EXPECT_DOUBLE_EQ(layer.options().codebook_scale(), 1.5 / static_cast<double>(1 << l)) << "layer " << l;
  }
  rlfq->eval();
  const at::Tensor x = torch::tensor({{{1.0f, -2.0f, 0.5f}}});
  // Layer 0: (+1.5, -1.5, +1.5); residual (-0.5, -0.5, -1); layer 1: (-0.75, -0.75, -0.75); ...
  const QuantizerOutput out = rlfq->quantize(x, {});
  EXPECT_EQ(out.indices[0][0][0].item<int64_t>(), 0b101);
  EXPECT_EQ(out.indices[0][0][1].item<int64_t>(), 0b000);
  EXPECT_TRUE(torch::allclose(rlfq->decode(out.indices), out.quantized, 1e-6, 1e-6));
}

TEST(Residual, QuantizeDropoutKeepsAPrefixDrawnFromTheGenerator) {
  auto make = [] {
    return make_residual_vq(ResidualOptions(4).quantize_dropout(true).quantize_dropout_cutoff_index(1), VqOptions(3, 8),
                            seeded(1));
  };
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({2, 5, 3});
  std::set<int64_t> kept_counts;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    auto rvq = make();
    test_util::RecordingReducer reducer;
    const QuantizerOutput out = rvq->quantize(x, {&reducer, seeded(seed)});
    const at::Tensor dropped = (out.indices < 0).all(1).all(0);  // per layer
    int64_t kept = 0;
    while (kept < 4 && !dropped[kept].item<bool>()) ++kept;
    for (int64_t l = kept; l < 4; ++l) EXPECT_TRUE(dropped[l].item<bool>()) << "not a prefix, seed " << seed;
    EXPECT_GE(kept, 2) << "the cutoff index keeps layers 0 and 1";
    EXPECT_EQ(out.losses.size(), static_cast<size_t>(kept));
    EXPECT_EQ(reducer.tags.size(), static_cast<size_t>(kept));  // dropped layers do not reduce
    kept_counts.insert(kept);
    // The same generator seed drops the same layers.
    auto again = make();
    EXPECT_TRUE(torch::equal(again->quantize(x, {nullptr, seeded(seed)}).indices, out.indices));
    // Decode treats -1 as nothing: the sum of the kept layers' codes.
    at::Tensor expected = torch::zeros_like(x);
    for (int64_t l = 0; l < kept; ++l) expected += rvq->layers()[l]->decode(out.indices.select(2, l));
    EXPECT_TRUE(torch::allclose(rvq->decode(out.indices), expected, 1e-6, 1e-6));
  }
  EXPECT_EQ(kept_counts, (std::set<int64_t>{2, 3, 4}));
  auto evaluated = make();
  evaluated->eval();
  EXPECT_TRUE((evaluated->quantize(x, {nullptr, seeded(1)}).indices >= 0).all().item<bool>());
}

TEST(Residual, QuantizeDropoutRoundsUpToTheMultiple) {
  std::set<int64_t> kept_counts;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    auto rfsq = make_residual_fsq(ResidualOptions(4).quantize_dropout(true).quantize_dropout_multiple_of(2),
                                  FsqOptions({3, 3}));
    const QuantizerOutput out = rfsq->quantize(torch::randn({1, 4, 2}), {nullptr, seeded(seed)});
    kept_counts.insert((out.indices[0][0] >= 0).sum().item<int64_t>());
  }
  EXPECT_EQ(kept_counts, (std::set<int64_t>{2, 4}));
}

TEST(Residual, InvalidOptionsNameTheValue) {
  auto message = [](const ResidualOptions& o) {
    try {
      make_residual_fsq(o, FsqOptions({3}));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(ResidualOptions(0)).find("num_quantizers = 0"), std::string::npos);
  EXPECT_NE(message(ResidualOptions(2).quantize_dropout_cutoff_index(2)).find("quantize_dropout_cutoff_index = 2"),
            std::string::npos);
  EXPECT_NE(message(ResidualOptions(2).quantize_dropout_multiple_of(0)).find("quantize_dropout_multiple_of = 0"),
            std::string::npos);
  EXPECT_NE(message(ResidualOptions(2).quant_grad_frac(NAN)).find("quant_grad_frac = nan"), std::string::npos);
  // A size per layer is residual-vq's alone (FSQ layers have no codebook of their own size).
  EXPECT_NE(message(ResidualOptions(2).codebook_sizes({4, 8})).find("codebook_sizes is residual-vq's"),
            std::string::npos);
  EXPECT_THROW(make_residual_vq(ResidualOptions(2).codebook_sizes({4, 8, 16}), VqOptions(3, 8)), InvalidArgument);
  EXPECT_THROW(make_residual_vq(ResidualOptions(2).codebook_sizes({4, 0}), VqOptions(3, 8)), InvalidArgument);
  auto rvq = make_residual_vq(ResidualOptions(2), VqOptions(3, 8));
  EXPECT_THROW(rvq->decode(torch::zeros({1, 2, 3}, torch::kInt64)), InvalidArgument);
  EXPECT_THROW(rvq->quantize(torch::randn({1, 2, 4}), {}), InvalidArgument);
}

// A beam of 1 is the greedy search; a wider beam gives indices that decode to its output and a path
// whose summed per-layer losses are no larger than the greedy path's.
TEST(Residual, BeamSearchDecodesToItsOutputAndScoresNoWorseThanGreedy) {
  auto rvq = make_residual_vq(ResidualOptions(3).beam_size(4), VqOptions(4, 8), seeded(1));
  auto plain = make_residual_vq(ResidualOptions(3), VqOptions(4, 8), seeded(1));
  const at::Tensor x = torch::randn({2, 25, 4});
  rvq->eval();
  plain->eval();
  const QuantizerOutput greedy = plain->quantize(x, {});
  EXPECT_TRUE(torch::equal(rvq->quantize_beam(x, {}, 1).indices, greedy.indices));
  const QuantizerOutput beam = rvq->quantize(x, {});  // eval_beam_size: beam_size's 4
  EXPECT_TRUE(torch::equal(rvq->quantize_beam(x, {}, 4).indices, beam.indices));
  EXPECT_TRUE(torch::allclose(rvq->decode(beam.indices), beam.quantized, 1e-5, 1e-6));
  const auto summed = [](const QuantizerOutput& out) {
    double total = 0;
    for (const auto& [name, loss] : out.losses) total += loss.item<double>();
    return total;
  };
  EXPECT_LE(summed(beam), summed(greedy) + 1e-6);
  EXPECT_FALSE(torch::equal(beam.indices, greedy.indices));
  EXPECT_THROW(make_residual_fsq(ResidualOptions(2), FsqOptions({5, 5}))->quantize_beam(x.narrow(2, 0, 2), {}, 2),
               InvalidArgument);
}

// diveq: the layers' codes learned by gradient (parameters, no commitment loss), and the stack's output
// directional_reparam(input, the codes' sum) with the call's draw, in training and evaluation.
TEST(Residual, DiveqIsTheDirectionalReparameterisationOfTheCodesSum) {
  auto rvq = make_residual_vq(ResidualOptions(3).diveq(true), VqOptions(4, 16), seeded(1));
  const auto& layer = dynamic_cast<const Vq&>(*rvq->layers()[0]);
  EXPECT_TRUE(layer.embed().requires_grad());
  EXPECT_FALSE(layer.options().ema_update());
  const at::Tensor x = torch::randn({2, 10, 4});
  for (bool training : {true, false}) {
    rvq->train(training);
    const at::Generator generator = seeded(2);
    const QuantizerOutput out = rvq->quantize(x, {nullptr, generator.clone()});
    const at::Tensor codes = rvq->decode(out.indices).detach();
    const at::Tensor expected =
        directional_reparam(x.reshape({-1, 4}), codes.reshape({-1, 4}), 5e-3, generator.clone(), 0).reshape(x.sizes());
    EXPECT_TRUE(torch::allclose(out.quantized, expected, 1e-5, 1e-6)) << "training " << training;
    EXPECT_EQ(out.total_loss().item<float>(), 0.0f);
  }
}

// DiVeQ's value: the token moved exactly its distance to the code; without noise, onto the code.
TEST(Vq, DirectionalReparamMovesTheTokenItsDistanceToTheCode) {
  const at::Tensor t = torch::randn({30, 5}, torch::requires_grad());
  const at::Tensor q = torch::randn({30, 5});
  const at::Tensor exact = directional_reparam(t, q, 0.0, seeded(1), 0);
  EXPECT_TRUE(torch::allclose(exact, q, 1e-5, 1e-5));
  const at::Tensor noised = directional_reparam(t, q, 0.1, seeded(1), 0);
  EXPECT_TRUE(torch::allclose((noised - t).norm(2, -1), (q - t).norm(2, -1), 1e-5, 1e-5));
  EXPECT_FALSE(torch::allclose(noised, q, 1e-3, 1e-3));
  EXPECT_TRUE(torch::equal(noised, directional_reparam(t, q, 0.1, seeded(1), 0)));  // keyed by the draw
  EXPECT_TRUE(torch::equal(noised.narrow(0, 10, 20),                                // and each token's row
                           directional_reparam(t.narrow(0, 10, 20), q.narrow(0, 10, 20), 0.1, seeded(1), 10)));
}

// Implicit neural codebooks: layer l > 0 searches the codes its MLP makes from its codebook and the codes
// before it; decode rebuilds them the same way, and the codebooks and MLPs take gradients.
TEST(Residual, ImplicitCodebooksComeFromTheCodesBefore) {
  auto rvq =
      make_residual_vq(ResidualOptions(3).implicit_neural_codebook(true).mlp_depth(2), VqOptions(4, 8), seeded(1));
  std::set<std::string> names;
  for (const auto& p : rvq->named_parameters()) names.insert(p.key());
  EXPECT_TRUE(names.count("mlps.0.proj_in.weight") && names.count("mlps.1.layers.1.2.bias")) << names.size();
  EXPECT_TRUE(names.count("layer0.embed"));  // a learned codebook
  const at::Tensor x = torch::randn({2, 6, 4}, torch::requires_grad());
  rvq->train();
  const QuantizerOutput out = rvq->quantize(x, {nullptr, seeded(2)});
  EXPECT_TRUE(torch::allclose(rvq->decode(out.indices), out.quantized, 1e-5, 1e-5));
  // Layer 1's index is the nearest of the codes its MLP makes from layer 0's code.
  const at::Tensor layer0 = rvq->decode_layers(out.indices)[0];
  auto& vq1 = dynamic_cast<Vq&>(*rvq->layers()[1]);
  const at::Tensor codes =
      rvq->named_modules()["mlps.0"]->as<ImplicitCodebookImpl>()->forward(vq1.embed()[0], layer0.reshape({-1, 4}));
  const at::Tensor residual = (x - layer0).detach().reshape({-1, 1, 4});
  EXPECT_TRUE(torch::equal((residual - codes + 1e-6).norm(2, -1).argmin(1), out.indices.select(2, 1).reshape(-1)));
  (out.quantized.sum() + out.total_loss()).backward();
  EXPECT_TRUE(vq1.embed().grad().defined());
}

// The MLP maps each (condition, code) pair alone: forward_pairs on the codes a search chose gives forward's rows
// of them, and its gradient is theirs (what lets backward run the MLP on the chosen codes alone).
TEST(Residual, AnImplicitCodebooksChosenPairsAreItsRowsOfThem) {
  ImplicitCodebook mlp(ImplicitCodebookOptions(4).depth(2));
  torch::manual_seed(4);
  const at::Tensor codes = torch::randn({8, 4}, torch::requires_grad());
  const at::Tensor condition = torch::randn({5, 4});
  const at::Tensor chosen = torch::randint(0, 8, {5, 3});
  const at::Tensor all = mlp->forward(codes, condition);  // (5, 8, 4)
  const at::Tensor rows = all.gather(1, chosen.unsqueeze(2).expand({5, 3, 4}));
  const at::Tensor pairs = mlp->forward_pairs(codes.index_select(0, chosen.reshape(-1)).reshape({5, 3, 4}), condition);
  EXPECT_TRUE(torch::allclose(pairs, rows, 1e-6, 1e-5));
  const at::Tensor weights = torch::randn({5, 3, 4});
  const at::Tensor from_all = torch::autograd::grad({(rows * weights).sum()}, {codes})[0];
  const at::Tensor from_pairs = torch::autograd::grad({(pairs * weights).sum()}, {codes})[0];
  EXPECT_TRUE(torch::allclose(from_pairs, from_all, 1e-5, 1e-5));
  EXPECT_THROW(mlp->forward_pairs(torch::randn({4, 3, 4}), condition), InvalidArgument);
}

// Beam search with implicit codebooks: each path's codes at a layer from that path's sum so far; the paths'
// top-k codes are each path's nearest among its own codes, and the best path decodes to the output.
TEST(Residual, ImplicitCodebooksTakeEachBeamPathsOwnCodes) {
  auto rvq =
      make_residual_vq(ResidualOptions(3).implicit_neural_codebook(true).beam_size(3), VqOptions(4, 8), seeded(1));
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({2, 6, 4});
  rvq->eval();
  const QuantizerOutput beam = rvq->quantize(x, {});
  EXPECT_TRUE(torch::allclose(rvq->decode(beam.indices), beam.quantized, 1e-5, 1e-5));
  EXPECT_FALSE(torch::equal(beam.indices, rvq->quantize_beam(x, {}, 1).indices));
  // Vq's per-token top-k: the k nearest of each token's own codes, best first; k = 1 is quantize_implicit's.
  auto& vq1 = dynamic_cast<Vq&>(*rvq->layers()[1]);
  const at::Tensor tokens = torch::randn({3, 2, 4});
  const at::Tensor codes = torch::randn({6, 8, 4});
  const VqTopk top = vq1.quantize_topk_implicit(tokens, codes, 3, {});
  const at::Tensor distances = (tokens.reshape({6, 1, 4}) - codes + 1e-6).norm(2, -1);
  EXPECT_TRUE(torch::equal(top.indices.reshape({6, 3}), std::get<1>(distances.topk(3, 1, /*largest=*/false))));
  EXPECT_TRUE(torch::equal(top.indices.select(2, 0), vq1.quantize_implicit(tokens, codes, {}).indices));
  EXPECT_TRUE(
      torch::allclose(top.code_loss.reshape({6, 3}), std::get<0>(distances.topk(3, 1, false)).pow(2) / 4, 1e-4, 1e-5));
}

TEST(Residual, EachLayerHasTheCodebookSizeItIsGiven) {
  auto rvq = make_residual_vq(ResidualOptions(3).codebook_sizes({5, 12, 7}), VqOptions(4, 99), seeded(1));
  std::vector<int64_t> sizes;
  for (const auto& layer : rvq->layers()) sizes.push_back(layer->codebook_size());
  EXPECT_EQ(sizes, (std::vector<int64_t>{5, 12, 7}));
  EXPECT_EQ(rvq->codebook_size(), 5);  // the first layer's, as the reference reports it
  rvq->eval();
  const at::Tensor x = torch::randn({2, 40, 4});
  const QuantizerOutput out = rvq->quantize(x, {});
  EXPECT_LT(out.indices.select(2, 0).max().item<int64_t>(), 5);
  EXPECT_TRUE(torch::allclose(rvq->decode(out.indices), out.quantized, 1e-6, 1e-6));
}

// quant_grad_frac f: r_l = r_{l-1} - (f q_l + (1 - f) sg(q_l)), so a later layer's loss reaches the input
// also through the codes of the layers before it; 0 detaches them (the loss's gradient is then the
// straight-through one of each layer alone).
TEST(Residual, QuantGradFracPassesThatShareOfTheGradientThroughEachLayersCodes) {
  const at::Tensor x = torch::randn({2, 30, 4});
  auto input_gradient = [&](double frac) {
    auto rvq =
        make_residual_vq(ResidualOptions(3).quant_grad_frac(frac),
                         VqOptions(4, 16).estimator(VqEstimator::StraightThrough).commitment_weight(1.0), seeded(2));
    const at::Tensor input = x.clone().requires_grad_(true);
    const QuantizerOutput out = rvq->quantize(input, {nullptr, seeded(3)});
    out.losses.at("layer2.commitment").backward();
    return input.grad();
  };
  const at::Tensor none = input_gradient(0.0), half = input_gradient(0.5), whole = input_gradient(1.0);
  // Straight-through layers pass their gradient to their input as is: dr_l/dr_{l-1} = 1 - f, so layer
  // 2's commitment gradient reaches x times (1 - f)^2 (exact in float for f = 1/2 and 1).
  EXPECT_GT(none.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(half, none * 0.25));
  EXPECT_TRUE(torch::equal(whole, torch::zeros_like(none)));
  EXPECT_TRUE(torch::equal(input_gradient(-1.0), none));  // <= 0 detaches, as the reference's frac_gradient
}

}  // namespace
}  // namespace lockstep::quant
