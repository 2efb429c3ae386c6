// FID: the Fréchet distance against its closed form, the feature statistics against torch's
// covariance, and the Inception weights' layout checked by name and shape. (Agreement with
// pytorch-fid itself, features and distance: python/tests/test_fid.py.)
#include "lockstep/train/fid.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "error_of.h"
#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/tensor_convert.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/train/evaluate.h"

namespace lockstep::train {
namespace {
using test_util::error_of;

// For diagonal covariances the root is elementwise: sum (a - b)^2 + sum (sqrt(s1) - sqrt(s2))^2.
TEST(Fid, TheFrechetDistanceOfDiagonalGaussiansIsItsClosedForm) {
  const at::Tensor mu1 = torch::tensor({0.0, 1.0, 2.0}, torch::kFloat64),
                   mu2 = torch::tensor({1.0, 1.0, 0.0}, torch::kFloat64);
  const at::Tensor v1 = torch::tensor({1.0, 4.0, 9.0}, torch::kFloat64),
                   v2 = torch::tensor({4.0, 1.0, 9.0}, torch::kFloat64);
  const double expected = (mu1 - mu2).pow(2).sum().item<double>() + (v1.sqrt() - v2.sqrt()).pow(2).sum().item<double>();
  EXPECT_NEAR(frechet_distance(mu1, torch::diag(v1), mu2, torch::diag(v2)), expected, 1e-9);
  // Rotating both Gaussians alike changes nothing.
  const auto [q, r] = torch::linalg_qr(torch::randn({3, 3}, torch::kFloat64));
  EXPECT_NEAR(frechet_distance(q.mv(mu1), q.mm(torch::diag(v1)).mm(q.t()), q.mv(mu2), q.mm(torch::diag(v2)).mm(q.t())),
              expected, 1e-9);
}

TEST(Fid, FeatureStatisticsAreTheMeanAndCovarianceOfAllBatches) {
  const at::Tensor f = torch::randn({10, 4}, torch::kFloat64);
  FeatureStatistics s;
  s.add(f.narrow(0, 0, 3));
  s.add(f.narrow(0, 3, 7));
  EXPECT_EQ(s.count(), 10);
  EXPECT_TRUE(torch::allclose(s.mean(), f.mean(0), 1e-9, 1e-9));
  EXPECT_TRUE(torch::allclose(s.covariance(), torch::cov(f.t()), 1e-9, 1e-9));
  FeatureStatistics one;
  one.add(f.narrow(0, 0, 1));
  EXPECT_NE(error_of<InvalidArgument>([&] { one.covariance(); }).find("needs 2 images or more"), std::string::npos);
}

TEST(Fid, InceptionGives2048FeaturesAndItsWeightsAreCheckedByName) {
  torch::manual_seed(0);
  model::FidInception random;
  const at::Tensor f = random->features(torch::rand({2, 1, 28, 28}) * 2 - 1);
  EXPECT_EQ(f.sizes(), at::IntArrayRef({2, 2048}));
  EXPECT_TRUE(torch::isfinite(f).all().item<bool>());

  std::map<std::string, at::Tensor> weights;
  for (const auto& p : random->named_parameters(true)) weights[p.key()] = p.value().clone();
  for (const auto& b : random->named_buffers(true)) weights[b.key()] = b.value().clone();
  ASSERT_TRUE(weights.count("Mixed_7c.branch3x3dbl_3b.conv.weight"));  // torchvision's names
  ASSERT_TRUE(weights.count("Conv2d_1a_3x3.bn.running_var"));
  test_util::TempDir tmp;
  io::SafetensorsData data;
  for (const auto& [name, t] : weights) data.tensors[name] = io::to_raw(t);
  io::save_safetensors(tmp.file("w.safetensors"), data);
  const at::Tensor x = torch::rand({1, 3, 40, 40}) * 2 - 1;
  EXPECT_TRUE(torch::equal(load_fid_inception(tmp.file("w.safetensors"), "--fid")->features(x), random->features(x)));

  auto missing = weights;
  missing.erase("Mixed_6b.branch7x7dbl_4.bn.weight");
  EXPECT_NE(error_of<InvalidArgument>([&] {
              model::FidInception(missing, "f");
            }).find("f: no tensor 'Mixed_6b.branch7x7dbl_4.bn.weight'"),
            std::string::npos);
  auto aux = weights;
  aux["AuxLogits.fc.weight"] = torch::zeros({1000, 768});  // torchvision's classifier weights
  EXPECT_NE(error_of<InvalidArgument>([&] { model::FidInception(aux, "f"); }).find("'AuxLogits.fc.weight' is not part"),
            std::string::npos);
  auto wrong = weights;
  wrong["fc.weight"] = torch::zeros({1000, 2048});  // torchvision's 1000 classes, not the FID graph's 1008
  EXPECT_NE(
      error_of<InvalidArgument>([&] { model::FidInception(wrong, "f"); }).find("'fc.weight' has shape [1000, 2048]"),
      std::string::npos);
  EXPECT_NE(error_of<IoError>([&] { load_fid_inception(tmp.file("none"), "eval.fid_weights"); }).find("no such file"),
            std::string::npos);
  EXPECT_NE(error_of<IoError>([&] { load_fid_inception(tmp.path(), "eval.fid_weights"); }).find("is a directory"),
            std::string::npos);
  // Integer weights are refused when the file is read, as for LPIPS, not converted and used.
  data.tensors["fc.weight"] = io::to_raw(weights.at("fc.weight").to(torch::kInt32));
  io::save_safetensors(tmp.file("int.safetensors"), data);
  EXPECT_NE(error_of<CorruptInput>([&] {
              load_fid_inception(tmp.file("int.safetensors"), "--fid");
            }).find("--fid = " + tmp.file("int.safetensors") + ": tensor 'fc.weight' holds Int, not floating-point"),
            std::string::npos);
}

// An evaluation with Inception weights reports rFID over all its images: the held-out images
// against the reconstructions; none without them.
TEST(Fid, AnEvaluationWithInceptionWeightsReportsRfid) {
  torch::manual_seed(1);
  model::Autoencoder m(model::AutoencoderOptions(1, {8, 8}),
                       std::make_shared<quant::Fsq>(quant::FsqOptions({8, 5, 5, 5})));
  auto inception = std::make_shared<model::FidInceptionImpl>();
  const at::Tensor images = torch::rand({6, 1, 16, 16}) * 2 - 1;
  Evaluation with(*m, EvalOptions().batch_size(4).grid_images(0).fid(inception));
  with.add(images);
  const EvalResult r = with.result();
  ASSERT_TRUE(r.fid.has_value());
  EXPECT_GT(*r.fid, 0);
  Evaluation without(*m, EvalOptions().batch_size(4).grid_images(0));
  without.add(images);
  EXPECT_FALSE(without.result().fid.has_value());
}

}  // namespace
}  // namespace lockstep::train
