// The vqgan architecture: its layers sit where the options say, its attention is the textbook
// formula, its estimates are the hand counts, and settings that cannot work are named errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/model/autoencoder.h"
#include "lockstep/quant/fsq.h"
#include "model/vqgan_blocks.h"

namespace lockstep::model {
namespace {

AutoencoderOptions vqgan_options(std::vector<int64_t> channels, int64_t in_channels = 1) {
  return AutoencoderOptions(in_channels, std::move(channels)).architecture(Architecture::Vqgan).norm_groups(4);
}

Autoencoder make(const AutoencoderOptions& options) {
  return Autoencoder(options, std::make_shared<quant::Fsq>(quant::FsqOptions({8, 5, 5, 5})));  // latent: 4
}

TEST(Vqgan, ShapesFollowTheLevelsOnNonSquareImages) {
  const at::Tensor x = torch::rand({2, 3, 16, 24}) * 2 - 1;
  for (const std::vector<int64_t>& channels : {std::vector<int64_t>{8}, {8, 16}, {8, 16, 16}}) {
    auto m = make(vqgan_options(channels, 3).attention_levels({static_cast<int64_t>(channels.size()) - 1}));
    m->eval();
    const int64_t f = m->options().downsampling();
    const AutoencoderOutput out = m->forward(x, {});
    EXPECT_EQ(out.reconstruction.sizes(), x.sizes()) << channels.size() << " levels";
    EXPECT_EQ(out.quant.indices.sizes(), (std::vector<int64_t>{2, 16 / f, 24 / f})) << channels.size() << " levels";
    const at::Tensor ids = m->encode(x);
    EXPECT_TRUE(torch::equal(ids, out.quant.indices));
    EXPECT_TRUE(torch::allclose(m->decode(ids), out.reconstruction, 1e-5, 1e-6));
  }
}

// One letter per layer of a Sequential: C conv, R residual block, A attention, D down, U up, N norm + SiLU.
std::string layout(const Autoencoder& m, const std::string& part) {
  std::string out;
  for (const auto& layer : m->named_children()[part]->as<torch::nn::Sequential>()->children()) {
    out += layer->as<torch::nn::Conv2d>()   ? "C"
           : layer->as<vqgan::ResBlock>()   ? "R"
           : layer->as<vqgan::Attention>()  ? "A"
           : layer->as<vqgan::Downsample>() ? "D"
           : layer->as<vqgan::Upsample>()   ? "U"
           : layer->as<vqgan::NormSilu>()   ? "N"
                                            : "?";
  }
  return out;
}

TEST(Vqgan, AttentionSitsExactlyAtTheConfiguredLevels) {
  // Levels 0 and 1 attend, level 2 does not; the middle attends. 2 blocks per encoder level, 3 per decoder level.
  const Autoencoder m = make(vqgan_options({8, 16, 32}).res_blocks(2).attention_levels({1, 0}));
  EXPECT_EQ(layout(m, "encoder"), std::string("C") + "RARA" + "D" + "RARA" + "D" + "RR" + "RAR" + "N");
  EXPECT_EQ(layout(m, "decoder"), std::string("RAR") + "RRR" + "U" + "RARARA" + "U" + "RARARA" + "N" + "C");
  const Autoencoder plain = make(vqgan_options({8, 16}).attention_levels({}).mid_attention(false));
  EXPECT_EQ(layout(plain, "encoder"), "CRDRRRN");
  EXPECT_EQ(layout(plain, "decoder"), "RRRRURRNC");
}

TEST(Vqgan, ParametersAreTheHandCountAndNoBufferIsOutsideTheQuantizer) {
  const Autoencoder m = make(vqgan_options({4, 8}).attention_levels({1}));
  const auto conv = [](int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; };
  const auto res = [&](int64_t in, int64_t out) {
    return 2 * in + conv(in, out, 3) + 2 * out + conv(out, out, 3) + (in != out ? conv(in, out, 1) : 0);
  };
  const auto attn = [&](int64_t c) { return 2 * c + 4 * conv(c, c, 1); };
  const int64_t middle = res(8, 8) + attn(8) + res(8, 8);
  const int64_t encoder = conv(1, 4, 3) + res(4, 4) + conv(4, 4, 3) + res(4, 8) + attn(8) + middle + 2 * 8;
  const int64_t latent = conv(8, 4, 3) + conv(4, 8, 3);
  const int64_t decoder =
      middle + 2 * (res(8, 8) + attn(8)) + conv(8, 8, 3) + res(8, 4) + res(4, 4) + 2 * 4 + conv(4, 1, 3);
  int64_t count = 0;
  for (const auto& p : m->parameters()) count += p.numel();
  EXPECT_EQ(count, encoder + latent + decoder);
  // The checkpoint loader reads the input channels off the first parameter.
  const auto first = *m->named_parameters().begin();
  EXPECT_EQ(first.key(), "encoder.0.weight");
  EXPECT_EQ(first.value().sizes(), (std::vector<int64_t>{4, 1, 3, 3}));
  for (const auto& b : m->named_buffers()) {
    EXPECT_EQ(b.key().rfind("quantizer.", 0), 0u) << b.key() << " would need syncing across ranks";
  }
}

TEST(Vqgan, EveryParameterGetsAGradient) {
  auto m = make(vqgan_options({4, 8}).attention_levels({0, 1}));
  const at::Tensor x = torch::rand({2, 1, 8, 8});
  torch::mse_loss(m->forward(x, {}).reconstruction, x).backward();
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    if (p.key().rfind("from_latent.", 0) != 0) {  // from_latent's may be zero when every code is 0
      EXPECT_GT(p.value().grad().abs().sum().item<float>(), 0.0f) << p.key() << " has a zero gradient";
    }
  }
}

// GroupNorm, q, k, v and the output projection written out with loops in double precision.
TEST(Vqgan, AttentionIsTheSoftmaxOfScaledQueryKeyProductsAppliedToTheValues) {
  torch::manual_seed(7);
  const int64_t c = 4, groups = 2, h = 3, w = 2, n = h * w;
  vqgan::Attention a(c, groups);
  {
    torch::NoGradGuard no_grad;
    a->norm->weight.copy_(torch::rand({c}) + 0.5);
    a->norm->bias.copy_(torch::randn({c}));
    a->q->weight.mul_(4);  // peaked weights: a softmax over the wrong axis or a missing scale shows
    a->k->weight.mul_(4);
  }
  const at::Tensor x = torch::randn({2, c, h, w});
  const at::Tensor got = a->forward(x).detach();

  const auto weight = [](const torch::nn::Conv2d& conv) {
    return conv->weight.detach().reshape({-1}).to(torch::kDouble);
  };
  const auto bias = [](const torch::nn::Conv2d& conv) { return conv->bias.detach().to(torch::kDouble); };
  const at::Tensor gamma = a->norm->weight.detach().to(torch::kDouble),
                   beta = a->norm->bias.detach().to(torch::kDouble);
  const auto project = [&](const torch::nn::Conv2d& conv, const std::vector<std::vector<double>>& in) {
    const at::Tensor wt = weight(conv), bs = bias(conv);
    std::vector<std::vector<double>> out(c, std::vector<double>(n));
    for (int64_t o = 0; o < c; ++o) {
      for (int64_t p = 0; p < n; ++p) {
        double s = bs[o].item<double>();
        for (int64_t i = 0; i < c; ++i) s += wt[o * c + i].item<double>() * in[i][p];
        out[o][p] = s;
      }
    }
    return out;
  };
  const at::Tensor xd = x.to(torch::kDouble).reshape({2, c, n});
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<std::vector<double>> normed(c, std::vector<double>(n));
    const int64_t per = c / groups;
    for (int64_t g = 0; g < groups; ++g) {
      double mean = 0, var = 0;
      for (int64_t i = g * per; i < (g + 1) * per; ++i) {
        for (int64_t p = 0; p < n; ++p) mean += xd[b][i][p].item<double>() / (per * n);
      }
      for (int64_t i = g * per; i < (g + 1) * per; ++i) {
        for (int64_t p = 0; p < n; ++p) var += std::pow(xd[b][i][p].item<double>() - mean, 2) / (per * n);
      }
      for (int64_t i = g * per; i < (g + 1) * per; ++i) {
        for (int64_t p = 0; p < n; ++p) {
          normed[i][p] = (xd[b][i][p].item<double>() - mean) / std::sqrt(var + 1e-6) * gamma[i].item<double>() +
                         beta[i].item<double>();
        }
      }
    }
    const auto q = project(a->q, normed), k = project(a->k, normed), v = project(a->v, normed);
    std::vector<std::vector<double>> attended(c, std::vector<double>(n, 0.0));
    for (int64_t i = 0; i < n; ++i) {  // query position i: softmax over the key positions j
      std::vector<double> e(n);
      double total = 0;
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t d = 0; d < c; ++d) s += q[d][i] * k[d][j];
        total += e[j] = std::exp(s / std::sqrt(static_cast<double>(c)));
      }
      for (int64_t d = 0; d < c; ++d) {
        for (int64_t j = 0; j < n; ++j) attended[d][i] += e[j] / total * v[d][j];
      }
    }
    const auto projected = project(a->proj_out, attended);
    for (int64_t d = 0; d < c; ++d) {
      for (int64_t p = 0; p < n; ++p) {
        EXPECT_NEAR(got[b][d][p / w][p % w].item<double>(), xd[b][d][p].item<double>() + projected[d][p], 1e-5)
            << "image " << b << ", channel " << d << ", position " << p;
      }
    }
  }
}

// Counted by hand for channels [4, 8], one block, attention at level 1, no middle attention, FSQ's
// 4 latent channels, 4x4 images (levels of 16 and 4 pixels). Per layer (layer: floats):
//   encoder: conv 4*16 = 64; block 4->4 at 0: (2*4 + 5*4)*16 = 448; down: 4*5*5 + 4*4 = 116;
//            block 4->8 at 1: (2*4 + 6*8)*4 = 224; attention: 9*8*4 + 2*4*4 = 320; 2 middle blocks 448;
//            norm+SiLU 2*8*4 = 64                                                      -> 1,684
//   latent:  to_latent, quantizer 4*4*4 = 64; from_latent 8*4 = 32                     -> 96
//   decoder: 2 middle blocks 448; 2 blocks and attentions at 1: 2*(224 + 320) = 1,088; up 2*8*16 = 256;
//            block 8->4 at 0: (2*8 + 6*4)*16 = 640, block 4->4: 448; norm+SiLU 2*4*16 = 128;
//            conv 1*16 = 16                                                            -> 3,024
TEST(Vqgan, CountsTheActivationsAStepKeepsPerImage) {
  const Autoencoder m = make(vqgan_options({4, 8}).attention_levels({1}).mid_attention(false));
  EXPECT_EQ(m->activation_floats_per_image(4, 4), 1684 + 96 + 3024);
  // Without gradients the widest moment is the decoder's block 8->4 at full size: its input (8*16)
  // and the norm, SiLU and conv of its first statement (8 + 8 + 4)*16; plus the image.
  EXPECT_EQ(m->inference_floats_per_image(4, 4), 8 * 16 + 20 * 16 + 16);
  // Attention at full resolution on 32x32 adds, per attention (1 in the encoder, 2 in the decoder),
  // 9 tensors of 4 x 1024 and the 1024 x 1024 scores and softmax.
  const Autoencoder full = make(vqgan_options({4, 8}).attention_levels({0, 1}).mid_attention(false));
  EXPECT_EQ(full->activation_floats_per_image(32, 32) - m->activation_floats_per_image(32, 32),
            3 * (9 * 4 * 1024 + 2 * 1024 * 1024));
  EXPECT_GE(full->inference_floats_per_image(32, 32), 2 * 1024 * 1024);
}

TEST(Vqgan, SettingsThatCannotWorkAreNamedErrors) {
  const auto message = [](const AutoencoderOptions& o) {
    try {
      make(o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(message(vqgan_options({8, 12}).norm_groups(8)),
            "model: level 1 has 12 channels, which norm_groups = 8 does not divide (GroupNorm splits each level's "
            "channels into norm_groups groups)");
  EXPECT_EQ(message(vqgan_options({8, 8}).attention_levels({0, 2})),
            "model: attention_levels = [0, 2] holds level 2, but the model has 2 levels (0 to 1)");
  EXPECT_EQ(message(vqgan_options({8, 8}).attention_levels({1, 1})),
            "model: attention_levels = [1, 1] lists level 1 twice");
  EXPECT_EQ(message(vqgan_options({8, 8}).attention_levels({-1})),
            "model: attention_levels = [-1] holds level -1, but the model has 2 levels (0 to 1)");
  EXPECT_EQ(message(vqgan_options({8, 8}).batch_norm(true)),
            "model: batch_norm = true cannot be used with architecture vqgan, which normalises with GroupNorm; set "
            "batch_norm = false");
  EXPECT_EQ(message(vqgan_options({8, 8}).res_blocks(0)),
            "model: res_blocks = 0 must be >= 1 with architecture vqgan (the first block of each level changes its "
            "channel count)");
  EXPECT_EQ(message(vqgan_options({8, 8}).norm_groups(0)), "model: norm_groups = 0 must be >= 1");
  EXPECT_EQ(message(AutoencoderOptions(1, {8, 8}).attention_levels({1})),
            "model: attention_levels = [1] needs architecture vqgan; the conv architecture has no attention");
  EXPECT_EQ(message(vqgan_options({8, 8}).attention_levels({1})), "(accepted)");
  EXPECT_EQ(parse_architecture("vqgan"), Architecture::Vqgan);
  EXPECT_EQ(parse_architecture("conv"), Architecture::Conv);
  try {
    parse_architecture("VQGAN");
    FAIL() << "accepted VQGAN";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "model: unknown architecture 'VQGAN'; choose one of: conv, vqgan");
  }
}

}  // namespace
}  // namespace lockstep::model
