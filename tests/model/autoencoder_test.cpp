#include "lockstep/model/autoencoder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/quant/fsq.h"

namespace lockstep::model {
namespace {

Autoencoder make(std::vector<int64_t> channels, int64_t in_channels = 1) {
  return Autoencoder(AutoencoderOptions(in_channels, std::move(channels)).res_blocks(1),
                     std::make_shared<quant::Fsq>(quant::FsqOptions({8, 5, 5, 5})));
}

TEST(Autoencoder, ShapesFollowTheLevels) {
  auto m = make({8, 16, 16});
  const at::Tensor x = torch::rand({2, 1, 28, 28}) * 2 - 1;
  const AutoencoderOutput out = m->forward(x, {});
  EXPECT_EQ(out.reconstruction.sizes(), x.sizes());
  EXPECT_EQ(out.quant.indices.sizes(), (std::vector<int64_t>{2, 7, 7}));
  EXPECT_EQ(m->encode(x).sizes(), (std::vector<int64_t>{2, 7, 7}));
}

TEST(Autoencoder, DecodeOfEncodeIsTheForwardReconstruction) {
  auto m = make({8, 16}, 3);
  m->eval();
  const at::Tensor x = torch::rand({3, 3, 16, 12}) * 2 - 1;
  const at::Tensor ids = m->encode(x);
  EXPECT_TRUE(torch::allclose(m->decode(ids), m->forward(x, {}).reconstruction, 1e-5, 1e-6));
}

TEST(Autoencoder, GradientsReachTheEncoderThroughTheQuantizer) {
  auto m = make({8, 16});
  const at::Tensor x = torch::rand({2, 1, 8, 8});
  torch::mse_loss(m->forward(x, {}).reconstruction, x).backward();
  // Every parameter gets a gradient; those before the quantizer get a non-zero one only if the
  // straight-through estimator passes it on. (from_latent's may be zero when every code is 0.)
  int before_quantizer = 0;
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    if (p.key().rfind("encoder.", 0) == 0 || p.key().rfind("to_latent.", 0) == 0) {
      ++before_quantizer;
      EXPECT_GT(p.value().grad().abs().sum().item<float>(), 0.0f) << p.key() << " has a zero gradient";
    }
  }
  EXPECT_GE(before_quantizer, 4);
}

// The trainer's memory check counts what a step keeps per image; counted by hand here for the
// default model on 28x28 (levels of 784, 196 and 49 pixels; FSQ's latent has 4 channels):
//   encoder 16*784 + (16*784 + 32*196) + (32*196 + 64*49) + 5*64*49 (block) + 64*49 (SiLU) = 59,584
//   latent  4*4*49 + 64*49 = 3,920
//   decoder 5*64*49 + (64*49 + 32*196) + (32*196 + 16*784) + 16*784 + 1*784 = 57,232
// 120,736 floats, 0.95 of the 127,000 measured as resident growth per image at batch 2048.
TEST(Autoencoder, CountsTheActivationsAStepKeepsPerImage) {
  const Autoencoder m = make({16, 32, 64});
  EXPECT_EQ(m->activation_floats_per_image(28, 28), 120736);
  EXPECT_EQ(m->activation_floats_per_image(56, 28), 2 * 120736);
  const Autoencoder deeper(AutoencoderOptions(1, {16, 32, 64}).res_blocks(3),
                           std::make_shared<quant::Fsq>(quant::FsqOptions({8, 5, 5, 5})));
  EXPECT_EQ(deeper->activation_floats_per_image(28, 28), 120736 + 2 * 2 * 5 * 64 * 49);  // 4 more blocks
  // Without gradients only the widest layer's input and output (16 channels at full size) and the
  // image are alive at once: (2 * 16 + 1) * 784. Decoding 2000x2000 tokens (8000x8000 pixels) was
  // measured at 14.5 GB peak against this bound's 8.4 GB.
  EXPECT_EQ(m->inference_floats_per_image(28, 28), 33 * 784);
}

// The output convolution is the decoder's last layer in both architectures: changing its weight
// changes the image, and it is the model's own parameter (the adaptive weight differentiates it).
TEST(Autoencoder, TheOutputWeightWritesTheImage) {
  for (const Architecture a : {Architecture::Conv, Architecture::Vqgan}) {
    Autoencoder m(AutoencoderOptions(3, {8, 16}).architecture(a).norm_groups(4),
                  std::make_shared<quant::Fsq>(quant::FsqOptions({8, 5, 5, 5})));
    const at::Tensor w = m->output_weight();
    EXPECT_EQ(w.sizes(), at::IntArrayRef({3, 8, 3, 3}));
    bool own = false;
    for (const auto& p : m->parameters()) own |= p.is_same(w);
    EXPECT_TRUE(own);
    m->eval();
    const at::Tensor x = torch::rand({1, 3, 8, 8}) * 2 - 1;
    const at::Tensor before = m->forward(x, quant::QuantizeContext{}).reconstruction;
    {
      torch::NoGradGuard no_grad;
      w.zero_();
    }
    // A zero output convolution leaves only its bias: the same value at every pixel of a channel.
    const at::Tensor after = m->forward(x, quant::QuantizeContext{}).reconstruction;
    EXPECT_FALSE(torch::allclose(before, after));
    EXPECT_LT((after - after.mean({2, 3}, true)).abs().max().item<double>(), 1e-6);
  }
}

TEST(Autoencoder, ImpossibleShapesAreNamedErrors) {
  EXPECT_THROW(make({}), InvalidArgument);
  EXPECT_THROW(make({8, 0}), InvalidArgument);
  auto m = make({8, 16, 16, 16});
  try {
    m->forward(torch::zeros({1, 1, 28, 28}), {});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("28x28"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m->forward(torch::zeros({1, 3, 32, 32}), {}), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::model
