#include "model/vqgan_blocks.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

namespace lockstep::model::vqgan {
namespace {
namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding));
}
// taming's Normalize: affine GroupNorm with eps 1e-6.
nn::GroupNorm group_norm(int64_t channels, int64_t groups) {
  return nn::GroupNorm(nn::GroupNormOptions(groups, channels).eps(1e-6));
}

bool attends(const AutoencoderOptions& o, int64_t level) {
  const auto& levels = o.attention_levels();
  return std::find(levels.begin(), levels.end(), level) != levels.end();
}

// block, [attention], block at the lowest resolution.
void append_middle(const AutoencoderOptions& o, std::vector<Layer>* layers) {
  const int64_t last = static_cast<int64_t>(o.channels().size()) - 1, c = o.channels().back();
  layers->push_back({Layer::Kind::ResBlock, c, c, last});
  if (o.mid_attention()) layers->push_back({Layer::Kind::Attention, c, c, last});
  layers->push_back({Layer::Kind::ResBlock, c, c, last});
}

int64_t area(int64_t h, int64_t w, int64_t level) { return (h >> level) * (w >> level); }
}  // namespace

ResBlockImpl::ResBlockImpl(int64_t in, int64_t out, int64_t groups)
    : norm1(register_module("norm1", group_norm(in, groups))),
      norm2(register_module("norm2", group_norm(out, groups))),
      conv1(register_module("conv1", conv(in, out, 3, 1, 1))),
      conv2(register_module("conv2", conv(out, out, 3, 1, 1))) {
  if (in != out) shortcut = register_module("shortcut", conv(in, out, 1));
}

at::Tensor ResBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv1(torch::silu(norm1(x)));
  h = conv2(torch::silu(norm2(h)));
  return (shortcut ? shortcut(x) : x) + h;
}

AttentionImpl::AttentionImpl(int64_t channels, int64_t groups)
    : norm(register_module("norm", group_norm(channels, groups))),
      q(register_module("q", conv(channels, channels, 1))),
      k(register_module("k", conv(channels, channels, 1))),
      v(register_module("v", conv(channels, channels, 1))),
      proj_out(register_module("proj_out", conv(channels, channels, 1))) {}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  const at::Tensor h = norm(x);
  const int64_t b = x.size(0), c = x.size(1), n = x.size(2) * x.size(3);
  // Queries (b, n, c) scaled before the product, which costs c*n floats instead of n*n.
  const at::Tensor queries = q(h).reshape({b, c, n}).transpose(1, 2) * (1.0 / std::sqrt(static_cast<double>(c)));
  const at::Tensor weights = torch::softmax(torch::bmm(queries, k(h).reshape({b, c, n})), 2);  // (b, query, key)
  const at::Tensor attended = torch::bmm(v(h).reshape({b, c, n}), weights.transpose(1, 2));    // (b, c, query)
  return x + proj_out(attended.reshape(x.sizes()));
}

DownsampleImpl::DownsampleImpl(int64_t channels)
    : conv(register_module("conv", vqgan::conv(channels, channels, 3, 2))) {}

at::Tensor DownsampleImpl::forward(const at::Tensor& x) { return conv(at::constant_pad_nd(x, {0, 1, 0, 1}, 0)); }

UpsampleImpl::UpsampleImpl(int64_t channels)
    : conv(register_module("conv", vqgan::conv(channels, channels, 3, 1, 1))) {}

at::Tensor UpsampleImpl::forward(const at::Tensor& x) {
  return conv(at::upsample_nearest2d(x, {2 * x.size(2), 2 * x.size(3)}));
}

NormSiluImpl::NormSiluImpl(int64_t channels, int64_t groups)
    : norm(register_module("norm", group_norm(channels, groups))) {}

at::Tensor NormSiluImpl::forward(const at::Tensor& x) { return torch::silu(norm(x)); }

std::vector<Layer> encoder_layers(const AutoencoderOptions& o) {
  using K = Layer::Kind;
  const auto& ch = o.channels();
  const auto levels = static_cast<int64_t>(ch.size());
  std::vector<Layer> layers{{K::Conv3x3, o.in_channels(), ch[0], 0}};
  for (int64_t i = 0; i < levels; ++i) {
    // The first block of a level takes the previous level's channels (taming's block_in).
    for (int64_t r = 0; r < o.res_blocks(); ++r) {
      layers.push_back({K::ResBlock, r == 0 && i > 0 ? ch[i - 1] : ch[i], ch[i], i});
      if (attends(o, i)) layers.push_back({K::Attention, ch[i], ch[i], i});
    }
    if (i + 1 < levels) layers.push_back({K::Downsample, ch[i], ch[i], i});
  }
  append_middle(o, &layers);
  layers.push_back({K::NormSilu, ch.back(), ch.back(), levels - 1});
  return layers;
}

std::vector<Layer> decoder_layers(const AutoencoderOptions& o) {
  using K = Layer::Kind;
  const auto& ch = o.channels();
  const auto last = static_cast<int64_t>(ch.size()) - 1;
  std::vector<Layer> layers;
  append_middle(o, &layers);
  for (int64_t i = last; i >= 0; --i) {
    // One block more than the encoder's (taming's num_res_blocks + 1); the first takes the channels
    // the upsample carried from the level below.
    for (int64_t r = 0; r <= o.res_blocks(); ++r) {
      layers.push_back({K::ResBlock, r == 0 && i < last ? ch[i + 1] : ch[i], ch[i], i});
      if (attends(o, i)) layers.push_back({K::Attention, ch[i], ch[i], i});
    }
    if (i > 0) layers.push_back({K::Upsample, ch[i], ch[i], i});
  }
  layers.push_back({K::NormSilu, ch[0], ch[0], 0});
  layers.push_back({K::Conv3x3, ch[0], o.in_channels(), 0});
  return layers;
}

nn::Sequential build(const std::vector<Layer>& layers, int64_t groups) {
  nn::Sequential seq;
  for (const Layer& l : layers) {
    switch (l.kind) {
      case Layer::Kind::Conv3x3:
        seq->push_back(conv(l.in, l.out, 3, 1, 1));
        break;
      case Layer::Kind::ResBlock:
        seq->push_back(ResBlock(l.in, l.out, groups));
        break;
      case Layer::Kind::Attention:
        seq->push_back(Attention(l.in, groups));
        break;
      case Layer::Kind::Downsample:
        seq->push_back(Downsample(l.in));
        break;
      case Layer::Kind::Upsample:
        seq->push_back(Upsample(l.in));
        break;
      case Layer::Kind::NormSilu:
        seq->push_back(NormSilu(l.in, groups));
        break;
    }
  }
  return seq;
}

// Per layer, the tensors its forward creates, as written above: a block's two norms, two SiLUs, two
// convolutions, shortcut and sum; attention's norm, q, k, v, scaled queries, scores, softmax,
// attended values, projection and sum.
int64_t activation_floats(const std::vector<Layer>& layers, int64_t h, int64_t w) {
  int64_t floats = 0;
  for (const Layer& l : layers) {
    const int64_t a = area(h, w, l.level);
    switch (l.kind) {
      case Layer::Kind::Conv3x3:
        floats += l.out * a;
        break;
      case Layer::Kind::ResBlock:
        floats += 2 * l.in * a + (l.in != l.out ? 6 : 5) * l.out * a;
        break;
      case Layer::Kind::Attention:
        floats += 9 * l.in * a + 2 * a * a;
        break;
      case Layer::Kind::Downsample:
        floats += l.in * ((h >> l.level) + 1) * ((w >> l.level) + 1) + l.out * area(h, w, l.level + 1);
        break;
      case Layer::Kind::Upsample:
        floats += 2 * l.out * area(h, w, l.level - 1);
        break;
      case Layer::Kind::NormSilu:
        floats += 2 * l.in * a;
        break;
    }
  }
  return floats;
}

// Per layer, its input and the temporaries of its largest statement.
int64_t inference_floats(const std::vector<Layer>& layers, int64_t h, int64_t w) {
  int64_t widest = 0;
  for (const Layer& l : layers) {
    const int64_t a = area(h, w, l.level);
    int64_t alive = 0;
    switch (l.kind) {
      case Layer::Kind::Conv3x3:
        alive = (l.in + l.out) * a;
        break;
      case Layer::Kind::ResBlock:
        alive = l.in * a + std::max(2 * l.in + l.out, 4 * l.out) * a;
        break;
      case Layer::Kind::Attention:
        alive = 4 * l.in * a + 2 * a * a;
        break;
      case Layer::Kind::Downsample:
        alive = l.in * a + l.in * ((h >> l.level) + 1) * ((w >> l.level) + 1) + l.out * area(h, w, l.level + 1);
        break;
      case Layer::Kind::Upsample:
        alive = l.in * a + 2 * l.out * area(h, w, l.level - 1);
        break;
      case Layer::Kind::NormSilu:
        alive = 3 * l.in * a;
        break;
    }
    widest = std::max(widest, alive);
  }
  return widest;
}

}  // namespace lockstep::model::vqgan
