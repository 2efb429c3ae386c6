// LPIPS-VGG: the layout is checked tensor by tensor, the distance behaves as a distance, and the
// weights file is read as the trainer reads it. (Agreement with the lpips package itself, on
// weights it makes: python/tests/test_lpips.py.)
#include "lockstep/model/lpips.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "error_of.h"
#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/tensor_convert.h"
#include "lockstep/train/lpips_weights.h"
#include "model/random_lpips.h"

namespace lockstep::model {
namespace {

std::map<std::string, at::Tensor> random_weights(uint64_t seed) { return test_util::random_lpips_weights(seed); }

using test_util::error_of;

TEST(Lpips, TheLayoutIsCheckedTensorByTensor) {
  auto w = random_weights(1);
  auto without = w;
  without.erase("net.slice3.12.bias");
  EXPECT_NE(error_of<InvalidArgument>([&] {
              Lpips(without, "f.safetensors");
            }).find("f.safetensors: no tensor 'net.slice3.12.bias'"),
            std::string::npos);
  auto alexnet = w;
  alexnet["net.slice1.0.weight"] = torch::zeros({64, 3, 11, 11});  // LPIPS-Alex's first convolution
  EXPECT_NE(error_of<InvalidArgument>([&] {
              Lpips(alexnet, "f");
            }).find("'net.slice1.0.weight' has shape [64, 3, 11, 11], LPIPS-VGG's is [64, 3, 3, 3]"),
            std::string::npos);
  auto extra = w;
  extra["lin5.model.1.weight"] = torch::zeros({1, 64, 1, 1});  // LPIPS-Squeeze has seven heads
  EXPECT_NE(error_of<InvalidArgument>([&] { Lpips(extra, "f"); }).find("'lin5.model.1.weight' is not part of"),
            std::string::npos);
  auto integers = w;
  integers["lin0.model.1.weight"] = torch::zeros({1, 64, 1, 1}, torch::kInt64);
  EXPECT_NE(error_of<InvalidArgument>([&] { Lpips(integers, "f"); }).find("not floating-point"), std::string::npos);
  // The lpips package names each head twice; the two must agree. Its scaling constants are checked.
  auto aliased = w;
  aliased["lins.2.model.1.weight"] = w.at("lin2.model.1.weight").clone();
  aliased["scaling_layer.shift"] = torch::tensor({-.030f, -.088f, -.188f}).reshape({1, 3, 1, 1});
  aliased["scaling_layer.scale"] = torch::tensor({.458f, .448f, .450f}).reshape({1, 3, 1, 1});
  EXPECT_NO_THROW(Lpips(aliased, "f"));
  aliased["lins.2.model.1.weight"] += 1;
  EXPECT_NE(error_of<InvalidArgument>([&] {
              Lpips(aliased, "f");
            }).find("'lins.2.model.1.weight' differs from 'lin2.model.1.weight'"),
            std::string::npos);
  aliased["lins.2.model.1.weight"] = w.at("lin2.model.1.weight").clone();
  aliased["scaling_layer.scale"] = torch::ones({1, 3, 1, 1});
  const std::string scale_error = error_of<InvalidArgument>([&] { Lpips(aliased, "f"); });
  EXPECT_NE(scale_error.find("'scaling_layer.scale' is"), std::string::npos) << scale_error;
}

TEST(Lpips, BehavesAsADistance) {
  Lpips lpips(random_weights(2), "random");
  torch::manual_seed(3);
  const at::Tensor x = torch::rand({3, 3, 32, 24}) * 2 - 1;
  const at::Tensor y = torch::rand({3, 3, 32, 24}) * 2 - 1;
  const at::Tensor d = lpips->forward(x, y);
  ASSERT_EQ(d.sizes(), at::IntArrayRef({3}));
  EXPECT_TRUE((d > 0).all().item<bool>()) << d;
  EXPECT_TRUE(torch::allclose(d, lpips->forward(y, x), 1e-5, 1e-7));
  EXPECT_LT(lpips->forward(x, x).abs().max().item<double>(), 1e-7);
  // Each image's distance is its own: batched as a whole or one by one, the same.
  EXPECT_TRUE(torch::allclose(d[1], lpips->forward(x.narrow(0, 1, 1), y.narrow(0, 1, 1))[0], 1e-5, 1e-7));
  // A nearer image is nearer: y moved halfway to x.
  EXPECT_TRUE((lpips->forward(x, (x + y) / 2) < d).all().item<bool>());
  // The heads weigh the layers linearly: doubling every head doubles the distance.
  auto doubled = random_weights(2);
  for (auto& [name, t] : doubled) {
    if (name.rfind("lin", 0) == 0) t *= 2;
  }
  EXPECT_TRUE(torch::allclose(Lpips(doubled, "doubled")->forward(x, y), 2 * d, 1e-5, 1e-7));
  // Grey images are compared as grey RGB.
  const at::Tensor g = x.narrow(1, 0, 1), h = y.narrow(1, 0, 1);
  EXPECT_TRUE(torch::allclose(lpips->forward(g, h),
                              lpips->forward(g.expand({-1, 3, -1, -1}), h.expand({-1, 3, -1, -1})), 1e-6, 1e-8));
  EXPECT_NE(error_of<InvalidArgument>([&] { lpips->forward(x.narrow(2, 0, 8), y.narrow(2, 0, 8)); }).find("too small"),
            std::string::npos);
}

TEST(Lpips, GradientsReachTheImagesAndNeverTheWeights) {
  Lpips lpips(random_weights(4), "random");
  const at::Tensor x = (torch::rand({2, 3, 16, 16}) * 2 - 1).requires_grad_();
  const at::Tensor y = torch::rand({2, 3, 16, 16}) * 2 - 1;
  lpips->forward(x, y).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_GT(x.grad().abs().sum().item<double>(), 0);
  EXPECT_TRUE(lpips->parameters().empty());
  for (const auto& b : lpips->buffers()) EXPECT_FALSE(b.requires_grad());
}

TEST(Lpips, TheWeightsFileIsReadOrNamed) {
  test_util::TempDir tmp;
  EXPECT_NE(error_of<IoError>([&] {
              train::load_lpips(tmp.file("none.safetensors"), "loss.lpips_weights");
            }).find("loss.lpips_weights = " + tmp.file("none.safetensors") + ": no such file"),
            std::string::npos);
  test_util::write_random_lpips_weights(tmp.file("w.safetensors"), 5);
  Lpips from_file = train::load_lpips(tmp.file("w.safetensors"), "loss.lpips_weights");
  Lpips direct(random_weights(5), "random");
  const at::Tensor x = torch::rand({1, 3, 16, 16}), y = torch::rand({1, 3, 16, 16});
  EXPECT_TRUE(torch::equal(from_file->forward(x, y), direct->forward(x, y)));
  io::SafetensorsData data = io::load_safetensors(tmp.file("w.safetensors"));
  data.tensors.erase("lin4.model.1.weight");
  io::save_safetensors(tmp.file("short.safetensors"), data);
  EXPECT_NE(error_of<InvalidArgument>([&] {
              train::load_lpips(tmp.file("short.safetensors"), "--lpips");
            }).find("--lpips = " + tmp.file("short.safetensors") + ": no tensor 'lin4.model.1.weight'"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::model
