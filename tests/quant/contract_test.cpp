// The contract every registered quantizer keeps, checked over each registry entry built from the
// configuration schema (the path `lockstep train --quantizer NAME` takes), plus variants of options.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cctype>
#include <set>

#include "lockstep/core/error.h"
#include "lockstep/quant/quantizer.h"
#include "lockstep/quant/registry.h"
#include "lockstep/train/config.h"
#include "lockstep/train/model_factory.h"
#include "recording_reducer.h"
#include "seeded.h"

namespace lockstep::quant {
namespace {

struct Variant {
  std::string quantizer;
  std::vector<std::string> settings;  // --set style "key=value"
  // The training forward's value leaves the codes by design (FSP's perturbation within a bin):
  // decode(encode(x)) is its value in evaluation only.
  bool training_perturbs = false;
};

std::string variant_name(const Variant& v) {
  std::string name = v.quantizer;
  for (const auto& s : v.settings) name += "_" + s;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

void PrintTo(const Variant& v, std::ostream* os) { *os << variant_name(v); }

// Small sizes keep the suite fast; every registered name appears (checked below).
const std::vector<Variant>& variants() {
  static const std::vector<Variant> list = {
      {"fsq", {}},
      {"fsq", {"quantizer.fsq.preserve_symmetry=true", "quantizer.fsq.num_codebooks=2"}},
      {"fsq", {"quantizer.fsq.dim=6"}},
      {"lfq", {"quantizer.lfq.codebook_size=64"}},
      {"lfq", {"quantizer.lfq.codebook_size=32", "quantizer.lfq.spherical=true", "quantizer.lfq.dim=7"}},
      {"lfq",
       {"quantizer.lfq.codebook_size=16", "quantizer.lfq.num_codebooks=2",
        "quantizer.lfq.frac_per_sample_entropy=0.5"}},
      {"vq", {"quantizer.vq.codebook_size=40"}},
      {"vq", {"quantizer.vq.codebook_size=24", "quantizer.vq.cosine=true", "quantizer.vq.rotation_trick=false"}},
      {"vq",
       {"quantizer.vq.codebook_size=16", "quantizer.vq.heads=2", "quantizer.vq.separate_codebook_per_head=true",
        "quantizer.vq.codebook_dim=3", "quantizer.vq.threshold_ema_dead_code=0.5",
        "quantizer.vq.orthogonal_reg_weight=0.1"}},
      {"vq",
       {"quantizer.vq.codebook_size=16", "quantizer.vq.affine_param=true", "quantizer.vq.threshold_ema_dead_code=0.5",
        "quantizer.vq.heads=2", "quantizer.vq.separate_codebook_per_head=true"}},
      {"simvq", {"quantizer.simvq.codebook_size=40"}},
      {"simvq",
       {"quantizer.simvq.codebook_size=24", "quantizer.simvq.frozen_codebook_dim=5",
        "quantizer.simvq.rotation_trick=false"}},
      {"latent", {}},
      {"latent", {"quantizer.latent.levels=[4, 3]", "quantizer.latent.num_codebooks=2", "quantizer.latent.dim=5"}},
      {"fsp", {}, true},
      {"fsp",
       {"quantizer.fsp.levels=[5, 4]", "quantizer.fsp.dim=5", "quantizer.fsp.activation=laplace",
        "quantizer.fsp.quantize_rate=0.5", "quantizer.fsp.need_inv_act=true", "quantizer.fsp.vector_norm=kurt"},
       true},
      {"fsp", {"quantizer.fsp.activation=normal", "quantizer.fsp.vector_norm=none", "quantizer.fsp.quantize_rate=1"}},
      {"residual-vq", {"quantizer.vq.codebook_size=32", "quantizer.residual.num_quantizers=3"}},
      // Dead codes replaced by batch tokens leave some residuals exactly 0: the rotation trick's
      // degenerate row, whose value must still be the code.
      {"residual-vq",
       {"quantizer.vq.codebook_size=16", "quantizer.residual.num_quantizers=2",
        "quantizer.vq.threshold_ema_dead_code=1"}},
      {"grouped-residual-vq",
       {"quantizer.vq.codebook_size=16", "quantizer.residual.num_quantizers=2",
        "quantizer.vq.threshold_ema_dead_code=1"}},
      {"grouped-residual-fsq", {"quantizer.residual.num_quantizers=2", "quantizer.grouped.groups=3"}},
      {"grouped-residual-lfq",
       {"quantizer.lfq.codebook_size=16", "quantizer.residual.num_quantizers=2", "quantizer.grouped.groups=1"}},
      {"residual-fsq", {"quantizer.residual.num_quantizers=3"}},
      {"residual-simvq",
       {"quantizer.simvq.codebook_size=16", "quantizer.residual.num_quantizers=2",
        "quantizer.simvq.frozen_codebook_dim=3"}},
      {"residual-lfq",
       {"quantizer.lfq.codebook_size=16", "quantizer.residual.num_quantizers=2", "quantizer.lfq.dim=6"}},
  };
  return list;
}

std::shared_ptr<Quantizer> build(const Variant& v, uint64_t seed) {
  train::Config config(train::lockstep_schema());
  for (const auto& s : v.settings) config.set_from_string(s);
  torch::manual_seed(seed);  // codebooks and projections come from the default generator
  return make_quantizer(v.quantizer, train::quantizer_options(config, v.quantizer));
}

using test_util::seeded;

std::map<std::string, at::Tensor> state_of(Quantizer& q) {
  std::map<std::string, at::Tensor> out;
  for (const auto& t : q.named_parameters()) out[t.key()] = t.value().detach().clone();
  for (const auto& t : q.named_buffers()) out[t.key()] = t.value().clone();
  return out;
}

class QuantizerContract : public ::testing::TestWithParam<Variant> {
 protected:
  at::Tensor tokens(int64_t b, int64_t n, uint64_t seed) const {
    torch::manual_seed(seed);
    return torch::randn({b, n, quantizer->dim()});
  }
  void SetUp() override { quantizer = build(GetParam(), 1); }
  std::shared_ptr<Quantizer> quantizer;
};

TEST(QuantizerContractSuite, CoversEveryRegisteredQuantizer) {
  std::set<std::string> covered;
  for (const auto& v : variants()) covered.insert(v.quantizer);
  for (const auto& name : quantizer_names()) EXPECT_TRUE(covered.count(name)) << name << " has no contract variant";
}

TEST_P(QuantizerContract, DecodeOfEncodeIsTheForwardValueAndIndicesAreInRange) {
  const at::Tensor x = tokens(3, 10, 2);
  const at::Tensor indices = quantizer->encode(x);
  const at::Tensor decoded = quantizer->decode(indices);
  const std::vector<int64_t> shape = quantizer->num_indices() == 1
                                         ? std::vector<int64_t>{3, 10}
                                         : std::vector<int64_t>{3, 10, quantizer->num_indices()};
  ASSERT_EQ(indices.sizes(), shape);
  EXPECT_EQ(indices.scalar_type(), torch::kInt64);
  EXPECT_GE(indices.min().item<int64_t>(), 0);
  EXPECT_LT(indices.max().item<int64_t>(), quantizer->codebook_size());
  ASSERT_EQ(decoded.sizes(), x.sizes());
  // Training forward (before its own state update) and evaluation forward both give decode(encode(x)).
  test_util::RecordingReducer reducer;
  const QuantizerOutput trained = quantizer->quantize(x, {&reducer, seeded(3)});
  EXPECT_TRUE(torch::equal(trained.indices, indices));
  if (!GetParam().training_perturbs) {
    EXPECT_TRUE(torch::allclose(trained.quantized, decoded, 1e-5, 1e-5)) << (trained.quantized - decoded).abs().max();
  }
  quantizer->eval();
  const QuantizerOutput evaluated = quantizer->quantize(x, {});
  EXPECT_TRUE(torch::equal(evaluated.indices, quantizer->encode(x)));
  EXPECT_TRUE(torch::allclose(evaluated.quantized, quantizer->decode(evaluated.indices), 1e-5, 1e-5))
      << (evaluated.quantized - quantizer->decode(evaluated.indices)).abs().max();
}

TEST_P(QuantizerContract, GradientsReachTheInputAndEveryParameter) {
  const at::Tensor x = tokens(2, 12, 4).requires_grad_();
  const QuantizerOutput out = quantizer->quantize(x, {nullptr, seeded(5)});
  torch::manual_seed(6);
  (out.quantized * torch::randn(out.quantized.sizes())).sum().add(out.total_loss()).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
  EXPECT_GT(x.grad().abs().sum().item<float>(), 0);
  for (const auto& p : quantizer->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<float>(), 0) << p.key();
  }
  for (const auto& [name, loss] : out.losses) {
    EXPECT_EQ(loss.dim(), 0) << name;
    EXPECT_TRUE(torch::isfinite(loss).item<bool>()) << name;
  }
}

TEST_P(QuantizerContract, ImagesGoThroughAsTokens) {
  torch::manual_seed(7);
  const at::Tensor images = torch::randn({2, quantizer->dim(), 3, 5});
  const at::Tensor as_tokens = image_to_tokens(images);
  ASSERT_EQ(as_tokens.sizes(), (std::vector<int64_t>{2, 15, quantizer->dim()}));
  quantizer->eval();
  const at::Tensor back = tokens_to_image(quantizer->quantize(as_tokens, {}).quantized, 3, 5);
  ASSERT_EQ(back.sizes(), images.sizes());
  EXPECT_TRUE(
      torch::allclose(back, tokens_to_image(quantizer->decode(quantizer->encode(as_tokens)), 3, 5), 1e-5, 1e-5));
}

TEST_P(QuantizerContract, StateRoundTripsIntoAFreshInstance) {
  for (int step = 0; step < 3; ++step) quantizer->quantize(tokens(2, 16, 10 + step), {nullptr, seeded(20 + step)});
  const auto saved = state_of(*quantizer);
  auto fresh = build(GetParam(), 99);  // other initial codebooks and projections
  {
    torch::NoGradGuard no_grad;
    for (auto& t : fresh->named_parameters()) t.value().copy_(saved.at(t.key()));
    for (auto& t : fresh->named_buffers()) t.value().copy_(saved.at(t.key()));
  }
  const auto restored = state_of(*fresh);
  ASSERT_EQ(restored.size(), saved.size());
  for (const auto& [name, value] : saved) EXPECT_TRUE(torch::equal(value, restored.at(name))) << name;
  const at::Tensor x = tokens(2, 9, 30);
  EXPECT_TRUE(torch::equal(quantizer->encode(x), fresh->encode(x)));
  EXPECT_TRUE(torch::equal(quantizer->decode(quantizer->encode(x)), fresh->decode(fresh->encode(x))));
}

TEST_P(QuantizerContract, EvaluationChangesNoStateAndCallsNoReducer) {
  quantizer->quantize(tokens(2, 8, 40), {nullptr, seeded(41)});  // past any first-call initialisation
  quantizer->eval();
  const auto before = state_of(*quantizer);
  test_util::RecordingReducer reducer;
  for (int i = 0; i < 2; ++i) quantizer->quantize(tokens(2, 8, 42 + i), {&reducer, seeded(43)});
  quantizer->encode(tokens(1, 4, 44));
  EXPECT_TRUE(reducer.tags.empty()) << reducer.tags.front();
  for (const auto& [name, value] : state_of(*quantizer)) EXPECT_TRUE(torch::equal(value, before.at(name))) << name;
}

TEST_P(QuantizerContract, TrainingReducesTheSameWayWhateverTheData) {
  quantizer->quantize(tokens(2, 8, 50), {nullptr, seeded(51)});  // past any first-call initialisation
  std::vector<std::vector<std::string>> calls;
  for (int64_t n : {0, 1, 17}) {
    test_util::RecordingReducer reducer;
    const QuantizerOutput out = quantizer->quantize(tokens(2, n, 52), {&reducer, seeded(53)});
    EXPECT_TRUE(torch::isfinite(out.total_loss()).item<bool>()) << "n = " << n;
    calls.push_back(reducer.tags);
  }
  EXPECT_EQ(calls[0], calls[1]);
  EXPECT_EQ(calls[0], calls[2]);
}

// A padding mask is honoured as mask_support() says (the same collectives; the padding's outputs 0
// and indices -1 where it says so) or refused by name: never ignored.
TEST_P(QuantizerContract, AMaskIsHonouredOrRefusedNeverIgnored) {
  QuantizeContext ctx{nullptr, seeded(61)};
  ctx.mask = torch::arange(6).unsqueeze(0) < torch::tensor({6, 2}).unsqueeze(1);
  const MaskSupport support = quantizer->mask_support();
  if (support == MaskSupport::Refused) {
    EXPECT_THROW(
        {
          try {
            quantizer->quantize(tokens(2, 6, 60), ctx);
          } catch (const InvalidArgument& e) {
            EXPECT_NE(std::string(e.what()).find("takes no mask"), std::string::npos) << e.what();
            throw;
          }
        },
        InvalidArgument);
    return;
  }
  quantizer->quantize(tokens(2, 6, 62), {nullptr, seeded(63)});  // past any first-call initialisation
  test_util::RecordingReducer masked, unmasked;
  ctx.reducer = &masked;
  const QuantizerOutput out = quantizer->quantize(tokens(2, 6, 60), ctx);
  quantizer->quantize(tokens(2, 6, 60), {&unmasked, seeded(61)});
  EXPECT_EQ(masked.tags, unmasked.tags);
  EXPECT_TRUE(torch::isfinite(out.total_loss()).item<bool>());
  EXPECT_TRUE((out.indices.index({ctx.mask}) >= 0).all().item<bool>());
  if (support == MaskSupport::StatisticsAndOutput) {
    EXPECT_TRUE((out.quantized.index({~ctx.mask}) == 0).all().item<bool>());
    EXPECT_TRUE((out.indices.index({~ctx.mask}) == -1).all().item<bool>());
  } else {  // padding quantized as any token
    EXPECT_TRUE((out.indices.index({~ctx.mask}) >= 0).all().item<bool>());
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, QuantizerContract, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& info) { return variant_name(info.param); });

}  // namespace
}  // namespace lockstep::quant
