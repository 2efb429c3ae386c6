#include "lockstep/quant/search_log.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/vq.h"
#include "seeded.h"

namespace lockstep::quant {
namespace {

using test_util::seeded;

TEST(SearchLog, AReplayHandsBackTheRecordedChoicesInOrder) {
  SearchLog record;
  int searched = 0;
  const at::Tensor first = record.choose({2, 3}, [&] {
    ++searched;
    return torch::arange(6, torch::kInt64).reshape({2, 3});
  });
  const at::Tensor second = record.choose({4}, [&] {
    ++searched;
    return torch::tensor({9, 8, 7, 6}, torch::kInt64);
  });
  EXPECT_EQ(searched, 2);
  EXPECT_THROW(record.choose({3}, [] { return torch::zeros({4}, torch::kInt64); }), InvalidArgument);

  SearchLog replay(record.recorded());
  EXPECT_TRUE(replay.replaying());
  const auto never = [&]() -> at::Tensor {
    ADD_FAILURE() << "a replay searched";
    return {};
  };
  EXPECT_TRUE(torch::equal(replay.choose({2, 3}, never), first));
  EXPECT_THROW(replay.check_all_taken(), InvalidArgument);  // the second choice is still there
  EXPECT_TRUE(torch::equal(replay.choose({4}, never), second));
  replay.check_all_taken();
  EXPECT_THROW(replay.choose({1}, never), InvalidArgument);  // more than the forward recorded

  EXPECT_EQ(SearchLog().recorded().numel(), 0);
  EXPECT_THROW(SearchLog(torch::zeros({2, 2}, torch::kInt64)), InvalidArgument);
  EXPECT_THROW(SearchLog(torch::zeros({4})), InvalidArgument);
}

// torch.compile's backward replays its forward: a residual beam search keeps every layer's choice
// and every kept path after its codebooks moved, where a search would now choose others.
TEST(SearchLog, AReplayedBeamSearchKeepsItsCodesAfterTheCodebooksMove) {
  auto rvq = make_residual_vq(ResidualOptions(3).beam_size(2), VqOptions(4, 8), seeded(1));
  rvq->eval();
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({2, 25, 4});
  SearchLog record;
  QuantizeContext ctx;
  ctx.searches = &record;
  const QuantizerOutput recorded = rvq->quantize(x, ctx);
  EXPECT_TRUE(torch::equal(recorded.indices, rvq->quantize(x, {}).indices));
  {
    torch::NoGradGuard no_grad;
    for (const auto& layer : rvq->layers()) dynamic_cast<Vq&>(*layer).embed().mul_(-0.5).add_(0.25);
  }
  SearchLog replay(record.recorded());
  ctx.searches = &replay;
  const QuantizerOutput replayed = rvq->quantize(x, ctx);
  replay.check_all_taken();
  EXPECT_TRUE(torch::equal(replayed.indices, recorded.indices));
  EXPECT_TRUE(torch::allclose(replayed.quantized, rvq->decode(recorded.indices), 1e-5, 1e-6));
  EXPECT_FALSE(torch::equal(rvq->quantize(x, {}).indices, recorded.indices));  // a search chooses others
}

}  // namespace
}  // namespace lockstep::quant
