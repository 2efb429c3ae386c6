#include "lockstep/model/discriminator.h"

#include <torch/torch.h>

#include <algorithm>

#include "lockstep/core/error.h"

namespace lockstep::model {
namespace {
namespace nn = torch::nn;

// The most groups up to 32 that divide `channels`.
int64_t groups_for(int64_t channels) {
  int64_t g = std::min<int64_t>(32, channels);
  while (channels % g != 0) --g;
  return g;
}

nn::Conv2d conv4x4(int64_t in, int64_t out, int64_t stride, bool bias) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 4).stride(stride).padding(1).bias(bias));
}
}  // namespace

DiscriminatorImpl::DiscriminatorImpl(DiscriminatorOptions options) : options_(options) {
  LOCKSTEP_CHECK_ARG(options_.in_channels_ >= 1 && options_.channels_ >= 1 && options_.layers_ >= 1,
                     "discriminator: in_channels ", options_.in_channels_, ", channels ", options_.channels_,
                     " and layers ", options_.layers_, " must all be >= 1");
  const int64_t ch = options_.channels_;
  auto width = [ch](int64_t n) { return ch * std::min<int64_t>(int64_t{1} << n, 8); };
  auto leaky = nn::Functional([](at::Tensor t) { return torch::leaky_relu(t, 0.2); });
  nn::Sequential seq;
  seq->push_back(conv4x4(options_.in_channels_, ch, 2, true));
  seq->push_back(leaky);
  for (int64_t n = 1; n <= options_.layers_; ++n) {
    // The last of these keeps the resolution (stride 1), as in VQGAN's NLayerDiscriminator.
    const int64_t stride = n < options_.layers_ ? 2 : 1;
    seq->push_back(conv4x4(width(n - 1), width(n), stride, false));
    seq->push_back(nn::GroupNorm(nn::GroupNormOptions(groups_for(width(n)), width(n))));
    seq->push_back(leaky);
  }
  seq->push_back(conv4x4(width(options_.layers_), 1, 1, true));
  layers_ = register_module("layers", seq);
  torch::NoGradGuard no_grad;
  for (const auto& m : layers_->modules(/*include_self=*/false)) {
    if (auto* conv = m->as<nn::Conv2dImpl>()) conv->weight.normal_(0.0, 0.02);
    if (auto* norm = m->as<nn::GroupNormImpl>()) {
      norm->weight.normal_(1.0, 0.02);
      norm->bias.zero_();
    }
  }
  lecam_real = register_buffer("lecam_real", torch::zeros({}));
  lecam_fake = register_buffer("lecam_fake", torch::zeros({}));
}

void DiscriminatorImpl::check_image_size(int64_t height, int64_t width) const {
  // Each stride-2 layer halves (rounding down), then two stride-1 4x4 layers take 1 pixel each.
  int64_t h = height, w = width;
  for (int64_t n = 0; n < options_.layers_; ++n) {
    h /= 2;
    w /= 2;
  }
  LOCKSTEP_CHECK_ARG(h >= 3 && w >= 3, "discriminator: images of ", width, "x", height, " are too small for ",
                     options_.layers_, " stride-2 layers (loss.disc_layers); each side needs at least ",
                     3 << options_.layers_, " pixels, or fewer layers");
}

int64_t DiscriminatorImpl::activation_floats_per_image(int64_t height, int64_t width) const {
  int64_t floats = 0, h = height, w = width, ch = options_.channels_;
  for (int64_t n = 0; n <= options_.layers_; ++n) {
    if (n < options_.layers_) {
      h /= 2;
      w /= 2;
    } else {
      --h;
      --w;
    }
    floats += 3 * ch * std::min<int64_t>(int64_t{1} << n, 8) * std::max<int64_t>(h, 1) * std::max<int64_t>(w, 1);
  }
  return floats;
}

at::Tensor DiscriminatorImpl::forward(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 4 && x.size(1) == options_.in_channels_, "discriminator: expected images (b, ",
                     options_.in_channels_, ", h, w), got ", x.sizes());
  check_image_size(x.size(2), x.size(3));
  return layers_->forward(x);
}

}  // namespace lockstep::model
