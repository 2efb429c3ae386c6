// Vq::keep_in_place_gradient: the gradient of the reference's in-place codebook loss, summed over the
// training calls whose updates ran, for an optimizer of the caller's (python/lockstep/vq.py).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/quant/vq.h"
#include "recording_reducer.h"
#include "seeded.h"

namespace lockstep::quant {
namespace {

using test_util::seeded;

// Tokens (b, n, 4) of two heads with separate codebooks of dimension 2 -> (2, b * n, 2), as Vq groups them.
at::Tensor per_head(const at::Tensor& x) { return x.reshape({x.size(0) * x.size(1), 2, 2}).permute({1, 0, 2}); }

QuantizerOutput deferred_call(Vq& vq, const at::Tensor& x, const at::Tensor& mask, test_util::RecordingReducer& r,
                              bool freeze = false) {
  QuantizeContext ctx{&r, seeded(5)};
  ctx.defer_updates = true;
  ctx.mask = mask;
  ctx.freeze_codebook = freeze;
  return vq.quantize(x, ctx);
}

TEST(VqInPlace, TheGradientIsTheInPlaceLossesAtTheCodesItsCallsSearched) {
  const VqOptions options =
      VqOptions(4, 8).heads(2).separate_codebook_per_head(true).codebook_dim(2).learnable_codebook(true).ema_update(
          false);
  Vq vq(options, seeded(1));
  vq.keep_in_place_gradient(true);
  torch::manual_seed(2);
  const at::Tensor x = torch::randn({3, 10, 4});
  const at::Tensor mask = torch::arange(10).lt(torch::tensor({10, 4, 7}).unsqueeze(1));
  test_util::RecordingReducer reducer;
  QuantizerOutput out = deferred_call(vq, x, mask, reducer);
  EXPECT_FALSE(vq.take_in_place_gradient().defined()) << "added only when the update runs";
  out.update(reducer);
  EXPECT_EQ(reducer.tags, std::vector<std::string>{"vq.in_place"});
  const at::Tensor grad = vq.take_in_place_gradient();
  ASSERT_TRUE(grad.defined());
  EXPECT_FALSE(vq.take_in_place_gradient().defined()) << "taking clears it";

  // The reference's loss: the mean over the counted tokens' coordinates of (code - token)^2, every head.
  const at::Tensor embed = vq.embed().detach().clone().requires_grad_(true);
  const at::Tensor indices = vq.encode(x).reshape({-1, 2}).t();  // (2, b * n); forward's -1 at padding
  EXPECT_TRUE(torch::equal(out.indices.reshape({-1, 2}).t().index_select(1, mask.reshape(-1).nonzero().squeeze(1)),
                           indices.index_select(1, mask.reshape(-1).nonzero().squeeze(1))));
  const at::Tensor counted = mask.reshape(-1).nonzero().squeeze(1);
  const at::Tensor codes = torch::stack({embed[0].index_select(0, indices[0]), embed[1].index_select(0, indices[1])});
  const at::Tensor loss =
      torch::mse_loss(codes.index_select(1, counted), per_head(x).index_select(1, counted).contiguous());
  const at::Tensor expected = torch::autograd::grad({loss}, {embed}, {}, /*retain_graph=*/true)[0];
  EXPECT_TRUE(torch::allclose(grad, expected, 1e-6, 1e-5)) << (grad - expected).abs().max();
  EXPECT_NEAR(out.losses.at("in_place").item<double>(), loss.item<double>(), 1e-6);
  EXPECT_FALSE(out.losses.at("in_place").requires_grad());

  // Two calls' updates sum; a frozen codebook adds nothing, an evaluation call neither.
  deferred_call(vq, x, mask, reducer).update(reducer);
  deferred_call(vq, x, {}, reducer).update(reducer);
  const QuantizerOutput frozen = deferred_call(vq, x, mask, reducer, /*freeze=*/true);
  EXPECT_EQ(frozen.losses.count("in_place"), 0u);
  vq.eval();
  EXPECT_EQ(deferred_call(vq, x, mask, reducer).losses.count("in_place"), 0u);
  vq.train();
  const at::Tensor loss_all = torch::mse_loss(codes, per_head(x).contiguous());
  const at::Tensor expected_two = expected + torch::autograd::grad({loss_all}, {embed})[0];
  const at::Tensor summed = vq.take_in_place_gradient();
  EXPECT_TRUE(torch::allclose(summed, expected_two, 1e-6, 1e-5)) << (summed - expected_two).abs().max();
}

}  // namespace
}  // namespace lockstep::quant
