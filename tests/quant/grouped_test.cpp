// Grouped quantizers: each group quantizes its own slice of the features, the indices and losses of the
// groups side by side, and every group draws as the first one does (quantize dropout keeps the same layers).
#include "lockstep/quant/grouped.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "lockstep/core/error.h"
#include "lockstep/quant/residual.h"

namespace lockstep::quant {
namespace {

std::shared_ptr<Grouped> grouped_fsq(bool dropout) {
  return make_grouped("grouped-residual-fsq", 3, [&] {
    return make_residual_fsq(ResidualOptions(4).quantize_dropout(dropout), FsqOptions({5, 5}));
  });
}

TEST(Grouped, EachGroupQuantizesItsOwnSliceOfTheFeatures) {
  const auto q = grouped_fsq(false);
  ASSERT_EQ(q->dim(), 6);
  ASSERT_EQ(q->num_indices(), 12);
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({2, 5, 6});
  const QuantizerOutput out = q->quantize(x, {});
  for (int64_t g = 0; g < 3; ++g) {
    const QuantizerOutput alone = q->groups()[g]->quantize(x.narrow(2, 2 * g, 2).contiguous(), {});
    EXPECT_TRUE(torch::equal(out.quantized.narrow(2, 2 * g, 2), alone.quantized)) << "group " << g;
    EXPECT_TRUE(torch::equal(out.indices.narrow(2, 4 * g, 4), alone.indices)) << "group " << g;
  }
  EXPECT_TRUE(torch::equal(q->encode(x), out.indices));
  EXPECT_TRUE(torch::allclose(q->decode(out.indices), out.quantized, 1e-6, 1e-6));
  EXPECT_THROW(q->quantize(torch::randn({2, 5, 5}), {}), InvalidArgument);
}

TEST(Grouped, UnderQuantizeDropoutEveryGroupKeepsTheSameLayersAndTheGeneratorAdvancesOnce) {
  const auto q = grouped_fsq(true);
  q->train();
  at::Generator generator = at::detail::createCPUGenerator(7);
  at::Generator alone = at::detail::createCPUGenerator(7);
  std::set<int64_t> kept_counts;
  for (int step = 0; step < 12; ++step) {
    const at::Tensor x = torch::randn({1, 4, 6});
    const at::Tensor indices = q->quantize(x, {nullptr, generator}).indices;  // (1, 4, 12)
    const at::Tensor kept = (indices >= 0).reshape({1, 4, 3, 4}).sum(-1);     // layers kept per token and group
    EXPECT_TRUE(torch::equal(kept, kept.flatten()[0].expand_as(kept))) << "step " << step;
    kept_counts.insert(kept.flatten()[0].item<int64_t>());
    // One group alone on a generator of the same seed draws the same cutoff, and leaves the same state.
    q->groups()[0]->quantize(x.narrow(2, 0, 2).contiguous(), {nullptr, alone});
    EXPECT_TRUE(torch::equal(generator.get_state(), alone.get_state())) << "step " << step;
  }
  EXPECT_GT(kept_counts.size(), 1u);
}

}  // namespace
}  // namespace lockstep::quant
