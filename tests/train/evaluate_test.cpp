// An evaluation's figures over a set fed in several batches and calls: the code histogram (usage,
// perplexity) and the reconstruction error are those of the whole set, not of the last batch.
#include "lockstep/train/evaluate.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/quant/fsq.h"

namespace lockstep::train {
namespace {

TEST(Evaluation, CodeUsageAndPerplexityAreThoseOfTheWholeSet) {
  torch::manual_seed(3);
  model::Autoencoder m(model::AutoencoderOptions(1, {8, 8}),
                       std::make_shared<quant::Fsq>(quant::FsqOptions({8, 5, 5, 5})));
  // Two calls, each split into batches of 4: 5 batches in all, the last of 2 images.
  const at::Tensor images = torch::rand({18, 1, 16, 16}) * 2 - 1;
  Evaluation e(*m, EvalOptions().batch_size(4).grid_images(0));
  e.add(images.narrow(0, 0, 10));
  e.add(images.narrow(0, 10, 8));
  const EvalResult r = e.result();

  m->eval();
  torch::NoGradGuard no_grad;
  const model::AutoencoderOutput whole = m->forward(images, quant::QuantizeContext{});
  const at::Tensor counts = torch::bincount(whole.quant.indices.flatten(), {}, 1000).to(torch::kFloat64);
  const at::Tensor p = counts / counts.sum();
  const at::Tensor used = p.gt(0);
  const double entropy = -(p.masked_select(used) * p.masked_select(used).log()).sum().item<double>();
  EXPECT_EQ(r.images, 18);
  EXPECT_EQ(r.codebook_size, 1000);
  EXPECT_EQ(r.codes_used, used.sum().item<int64_t>());
  EXPECT_GT(r.codes_used, 1);  // otherwise the perplexity below says nothing
  EXPECT_DOUBLE_EQ(r.code_usage, static_cast<double>(r.codes_used) / 1000);
  EXPECT_NEAR(r.perplexity, std::exp(entropy), 1e-9);
  EXPECT_GE(r.perplexity, 1.0);
  EXPECT_LE(r.perplexity, static_cast<double>(r.codes_used) + 1e-9);  // equal only when used evenly

  const at::Tensor diff = (whole.reconstruction.clamp(-1, 1) - images) / 2;
  EXPECT_NEAR(r.mse, diff.pow(2).mean().item<double>(), 1e-7);
  EXPECT_NEAR(r.psnr_db, 10 * std::log10(1 / r.mse), 1e-9);
}

}  // namespace
}  // namespace lockstep::train
