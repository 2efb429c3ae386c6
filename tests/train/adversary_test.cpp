// The adversary: the discriminator's shape, the adaptive weight's definition, a frozen
// discriminator in the model's loss, and what one discriminator step does (LeCam's averages).
#include "lockstep/train/adversary.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/dist/collective.h"

namespace lockstep::train {
namespace {

AdversaryOptions small(double lecam = 0) {
  AdversaryOptions o;
  o.weight = 0.5;
  o.lecam = lecam;
  o.channels = 8;
  o.layers = 2;
  return o;
}

TEST(Discriminator, JudgesPatchesAndRefusesImagesTooSmall) {
  torch::manual_seed(0);
  model::Discriminator d(model::DiscriminatorOptions(3).channels(8).layers(2));
  // Two stride-2 layers (28 -> 14 -> 7), then two 4x4 layers of stride 1 (7 -> 6 -> 5).
  EXPECT_EQ(d->forward(torch::zeros({2, 3, 28, 28})).sizes(), at::IntArrayRef({2, 1, 5, 5}));
  EXPECT_EQ(d->forward(torch::zeros({1, 3, 12, 40})).sizes(), at::IntArrayRef({1, 1, 1, 8}));
  try {
    d->forward(torch::zeros({1, 3, 8, 32}));
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("images of 32x8 are too small for 2 stride-2 layers"), std::string::npos)
        << e.what();
  }
  // No batch statistics: an image's logits do not depend on the others in its batch.
  const at::Tensor x = torch::randn({3, 3, 16, 16});
  EXPECT_TRUE(torch::allclose(d->forward(x).narrow(0, 1, 1), d->forward(x.narrow(0, 1, 1)), 1e-5, 1e-6));
}

TEST(Adversary, TheAdaptiveWeightIsTheRatioOfGradientNormsAtTheLastLayer) {
  Adversary a(small(), 3, dist::make_single_process_group(), at::kCPU);
  const at::Tensor w = torch::randn({4, 3}).requires_grad_();
  const at::Tensor nll = (w * torch::full({4, 3}, 2.0)).sum();  // gradient 2 everywhere: norm 2 sqrt(12)
  const at::Tensor adv = (w * torch::full({4, 3}, 3.0)).sum();  // 3 sqrt(12)
  EXPECT_NEAR(a.factor(nll, adv, w), 0.5 * (2 * std::sqrt(12.0)) / (3 * std::sqrt(12.0) + 1e-4), 1e-6);
  // Clamped at 1e4 when the adversarial gradient vanishes.
  EXPECT_NEAR(a.factor(nll, (w * 0).sum(), w), 0.5 * 1e4, 1e-6);
  AdversaryOptions fixed = small();
  fixed.adaptive_weight = false;
  EXPECT_EQ(Adversary(fixed, 3, dist::make_single_process_group(), at::kCPU).factor(nll, adv, w), 0.5);
}

TEST(Adversary, TheModelsLossReachesTheImagesButNotTheDiscriminator) {
  Adversary a(small(), 3, dist::make_single_process_group(), at::kCPU);
  const at::Tensor fake = torch::randn({2, 3, 16, 16}).requires_grad_();
  const at::Tensor loss = a.generator_loss(fake);
  const at::Tensor logits = a.discriminator().forward(fake.detach());
  EXPECT_NEAR(loss.item<double>(), -logits.mean().item<double>(), 1e-6);  // hinge: -mean D(fake)
  loss.backward();
  EXPECT_GT(fake.grad().abs().sum().item<double>(), 0);
  for (const auto& p : a.discriminator().parameters()) {
    EXPECT_FALSE(p.grad().defined());
    EXPECT_TRUE(p.requires_grad());  // restored for the discriminator's own step
  }
  AdversaryOptions ns = small();
  ns.objective = "non_saturating";
  Adversary b(ns, 3, dist::make_single_process_group(), at::kCPU);
  EXPECT_NEAR(b.generator_loss(fake).item<double>(),
              torch::softplus(-b.discriminator().forward(fake.detach())).mean().item<double>(), 1e-6);
}

TEST(Adversary, ADiscriminatorStepLearnsAndMovesLeCamsAverages) {
  torch::manual_seed(1);
  Adversary a(small(/*lecam=*/0.1), 3, dist::make_single_process_group(), at::kCPU);
  const at::Tensor real = torch::rand({4, 3, 16, 16}) * 2 - 1;
  const at::Tensor fake = torch::zeros({4, 3, 16, 16});
  at::Tensor real_mean, fake_mean;
  {
    torch::NoGradGuard no_grad;
    real_mean = a.discriminator().forward(real).mean();
    fake_mean = a.discriminator().forward(fake).mean();
  }
  const double expected = (torch::relu(1 - a.discriminator().forward(real)).mean() +
                           torch::relu(1 + a.discriminator().forward(fake)).mean())
                                  .item<double>() *
                              0.5 +
                          0.1 * (torch::relu(a.discriminator().forward(real)).pow(2).mean() +
                                 torch::relu(-a.discriminator().forward(fake)).pow(2).mean())
                                    .item<double>();  // the averages start at 0
  EXPECT_NEAR(a.train_step(real, fake, 1.0), expected, 1e-5);
  EXPECT_EQ(a.optimizer().steps(), 1);
  EXPECT_NEAR(a.discriminator().lecam_real.item<double>(), 0.001 * real_mean.item<double>(), 1e-8);
  EXPECT_NEAR(a.discriminator().lecam_fake.item<double>(), 0.001 * fake_mean.item<double>(), 1e-8);
  // Trained for a few steps it tells the two apart: hinge loss well below its starting ~1. Each
  // step follows a generator loss, as in training, whose freezing must not cost the gradient sync.
  double last = 0;
  for (int i = 0; i < 30; ++i) {
    a.generator_loss(fake);
    last = a.train_step(real, fake, 1.0);
  }
  EXPECT_LT(last, 0.5 * expected) << "first " << expected << ", last " << last;
}

// The non-saturating objective's discriminator step: softplus(-D(real)) and softplus(D(fake)),
// halved, without LeCam's averages moving.
TEST(Adversary, ANonSaturatingDiscriminatorStepIsTheLogisticLoss) {
  torch::manual_seed(2);
  AdversaryOptions ns = small();
  ns.objective = "non_saturating";
  Adversary a(ns, 3, dist::make_single_process_group(), at::kCPU);
  const at::Tensor real = torch::rand({4, 3, 16, 16}) * 2 - 1, fake = torch::rand({4, 3, 16, 16}) * 2 - 1;
  double expected = 0;
  {
    torch::NoGradGuard no_grad;
    expected = (torch::softplus(-a.discriminator().forward(real)).mean() +
                torch::softplus(a.discriminator().forward(fake)).mean())
                   .item<double>() *
               0.5;
  }
  EXPECT_NEAR(a.train_step(real, fake, 1.0), expected, 1e-5);
  EXPECT_EQ(a.discriminator().lecam_real.item<double>(), 0.0);
  double last = 0;
  for (int i = 0; i < 30; ++i) last = a.train_step(real, fake, 1.0);
  EXPECT_LT(last, 0.75 * expected) << "first " << expected << ", last " << last;  // about log 2 at chance
}

// Accumulated over two micro-batches of equal size (each weighted by its half of the batch), a
// step is the step on the whole batch: the same loss and, to rounding, the same weights after.
TEST(Adversary, AStepOverMicroBatchesIsTheStepOverTheWholeBatch) {
  const at::Tensor real = torch::rand({4, 3, 16, 16}) * 2 - 1, fake = torch::rand({4, 3, 16, 16}) * 2 - 1;
  torch::manual_seed(5);
  Adversary whole(small(/*lecam=*/0.1), 3, dist::make_single_process_group(), at::kCPU);
  torch::manual_seed(5);
  Adversary parts(small(/*lecam=*/0.1), 3, dist::make_single_process_group(), at::kCPU);
  const double a = whole.train_step(real, fake, 1.0);
  const double b = parts.train_step({real.narrow(0, 0, 2), real.narrow(0, 2, 2)},
                                    {fake.narrow(0, 0, 2), fake.narrow(0, 2, 2)}, {0.5, 0.5});
  EXPECT_NEAR(a, b, 1e-5);
  const auto pa = whole.discriminator().parameters(), pb = parts.discriminator().parameters();
  for (size_t k = 0; k < pa.size(); ++k) EXPECT_TRUE(torch::allclose(pa[k], pb[k], 1e-4, 1e-6)) << k;
  EXPECT_NEAR(whole.discriminator().lecam_real.item<double>(), parts.discriminator().lecam_real.item<double>(), 1e-7);
}

}  // namespace
}  // namespace lockstep::train
