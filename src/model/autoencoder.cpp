#include "lockstep/model/autoencoder.h"

#include <algorithm>

#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/quant/autocast.h"
#include "model/vqgan_blocks.h"

namespace lockstep::model {
namespace {
namespace nn = torch::nn;

// [BN ->] SiLU -> conv3x3 -> [BN ->] SiLU -> conv3x3, added to the input.
struct ResBlockImpl : nn::Module {
  ResBlockImpl(int64_t channels, bool batch_norm)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1)))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1)))) {
    if (batch_norm) {
      norm1 = register_module("norm1", nn::BatchNorm2d(channels));
      norm2 = register_module("norm2", nn::BatchNorm2d(channels));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor a = norm1 ? norm1(x) : x;
    const at::Tensor h = conv1(torch::silu(a));
    return x + conv2(torch::silu(norm2 ? norm2(h) : h));
  }
  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d norm1{nullptr}, norm2{nullptr};
};
TORCH_MODULE(ResBlock);

nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1));
}
nn::Functional silu() {
  return nn::Functional([](at::Tensor t) { return torch::silu(t); });
}
// Doubles height and width exactly.
nn::ConvTranspose2d upsample(int64_t in, int64_t out) {
  return nn::ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, 4).stride(2).padding(1));
}

std::string as_list(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "[" + out + "]";
}
}  // namespace

Architecture parse_architecture(const std::string& name) {
  if (name == "conv") return Architecture::Conv;
  if (name == "vqgan") return Architecture::Vqgan;
  throw InvalidArgument(detail::concat("model: unknown architecture '", name, "'; choose one of: conv, vqgan"));
}

void AutoencoderOptions::validate() const {
  LOCKSTEP_CHECK_ARG(in_channels_ >= 1, "model: in_channels = ", in_channels_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(!channels_.empty() && channels_.size() <= 8, "model: channels must list 1 to 8 levels, got ",
                     channels_.size());
  for (size_t i = 0; i < channels_.size(); ++i) {
    LOCKSTEP_CHECK_ARG(channels_[i] >= 1, "model: channels[", i, "] = ", channels_[i], " must be >= 1");
  }
  LOCKSTEP_CHECK_ARG(res_blocks_ >= 0, "model: res_blocks = ", res_blocks_, " must be >= 0");
  if (architecture_ == Architecture::Conv) {
    LOCKSTEP_CHECK_ARG(attention_levels_.empty(), "model: attention_levels = ", as_list(attention_levels_),
                       " needs architecture vqgan; the conv architecture has no attention");
    return;
  }
  LOCKSTEP_CHECK_ARG(!batch_norm_, "model: batch_norm = true cannot be used with architecture vqgan, which normalises",
                     " with GroupNorm; set batch_norm = false");
  LOCKSTEP_CHECK_ARG(res_blocks_ >= 1, "model: res_blocks = ", res_blocks_, " must be >= 1 with architecture vqgan",
                     " (the first block of each level changes its channel count)");
  LOCKSTEP_CHECK_ARG(norm_groups_ >= 1, "model: norm_groups = ", norm_groups_, " must be >= 1");
  for (size_t i = 0; i < channels_.size(); ++i) {
    LOCKSTEP_CHECK_ARG(channels_[i] % norm_groups_ == 0, "model: level ", i, " has ", channels_[i],
                       " channels, which norm_groups = ", norm_groups_, " does not divide (GroupNorm splits each",
                       " level's channels into norm_groups groups)");
  }
  const auto levels = static_cast<int64_t>(channels_.size());
  for (size_t j = 0; j < attention_levels_.size(); ++j) {
    const int64_t level = attention_levels_[j];
    LOCKSTEP_CHECK_ARG(level >= 0 && level < levels, "model: attention_levels = ", as_list(attention_levels_),
                       " holds level ", level, ", but the model has ", levels, " levels (0 to ", levels - 1, ")");
    for (size_t k = 0; k < j; ++k) {
      LOCKSTEP_CHECK_ARG(attention_levels_[k] != level, "model: attention_levels = ", as_list(attention_levels_),
                         " lists level ", level, " twice");
    }
  }
}

void AutoencoderOptions::check_image_size(int64_t height, int64_t width) const {
  const int64_t f = downsampling();
  LOCKSTEP_CHECK_ARG(height % f == 0 && width % f == 0 && height >= f && width >= f, "model: images of ", height, "x",
                     width, " cannot pass through ", channels_.size(), " levels (each dimension must be a",
                     " positive multiple of ", f, "); use fewer model.channels entries");
}

AutoencoderImpl::AutoencoderImpl(AutoencoderOptions options, std::shared_ptr<quant::Quantizer> quantizer)
    : options_(std::move(options)), quantizer_(std::move(quantizer)) {
  options_.validate();
  LOCKSTEP_CHECK_ARG(quantizer_ != nullptr, "model: no quantizer given");
  if (options_.architecture() == Architecture::Vqgan) {
    build_vqgan();
  } else {
    build_conv();
  }
}

// taming's VQGAN; its quant_conv and post_quant_conv (1x1) are left out: next to the 3x3
// convolutions to and from the latent they would add nothing a 3x3 convolution cannot express.
void AutoencoderImpl::build_vqgan() {
  const auto& ch = options_.channels();
  const int64_t latent = quantizer_->dim();
  encoder_ = register_module("encoder", vqgan::build(vqgan::encoder_layers(options_), options_.norm_groups()));
  to_latent_ = register_module("to_latent", nn::Conv2d(nn::Conv2dOptions(ch.back(), latent, 3).padding(1)));
  register_module("quantizer", quantizer_);
  from_latent_ = register_module("from_latent", nn::Conv2d(nn::Conv2dOptions(latent, ch.back(), 3).padding(1)));
  decoder_ = register_module("decoder", vqgan::build(vqgan::decoder_layers(options_), options_.norm_groups()));
}

void AutoencoderImpl::build_conv() {
  const auto& ch = options_.channels();
  const int64_t levels = static_cast<int64_t>(ch.size());
  const int64_t latent = quantizer_->dim();

  nn::Sequential enc;
  enc->push_back(conv3x3(options_.in_channels(), ch[0]));
  for (int64_t i = 1; i < levels; ++i) {
    enc->push_back(silu());
    enc->push_back(conv3x3(ch[i - 1], ch[i], 2));
  }
  for (int64_t i = 0; i < options_.res_blocks(); ++i) enc->push_back(ResBlock(ch.back(), options_.batch_norm()));
  enc->push_back(silu());
  encoder_ = register_module("encoder", enc);
  to_latent_ = register_module("to_latent", nn::Conv2d(nn::Conv2dOptions(ch.back(), latent, 1)));
  register_module("quantizer", quantizer_);
  from_latent_ = register_module("from_latent", nn::Conv2d(nn::Conv2dOptions(latent, ch.back(), 1)));

  nn::Sequential dec;
  for (int64_t i = 0; i < options_.res_blocks(); ++i) dec->push_back(ResBlock(ch.back(), options_.batch_norm()));
  for (int64_t i = levels - 1; i >= 1; --i) {
    dec->push_back(silu());
    dec->push_back(upsample(ch[i], ch[i - 1]));
  }
  dec->push_back(silu());
  dec->push_back(conv3x3(ch[0], options_.in_channels()));
  decoder_ = register_module("decoder", dec);
}

// Mirrors the constructor: conv and upsample outputs, the SiLUs between them, five tensors per
// residual block (SiLU, conv, SiLU, conv, sum), the latent and about three quantizer tensors of it.
int64_t AutoencoderImpl::activation_floats_per_image(int64_t h, int64_t w) const {
  const auto& ch = options_.channels();
  const auto levels = static_cast<int64_t>(ch.size());
  const auto area = [&](int64_t level) { return (h >> level) * (w >> level); };
  const int64_t deepest = ch.back() * area(levels - 1);
  if (options_.architecture() == Architecture::Vqgan) {  // as for conv around the quantizer
    return vqgan::activation_floats(vqgan::encoder_layers(options_), h, w) + 4 * quantizer_->dim() * area(levels - 1) +
           deepest + vqgan::activation_floats(vqgan::decoder_layers(options_), h, w);
  }
  const int64_t residual = 5 * deepest * options_.res_blocks();
  int64_t floats = ch[0] * area(0);                                                          // the first conv
  for (int64_t i = 1; i < levels; ++i) floats += ch[i - 1] * area(i - 1) + ch[i] * area(i);  // SiLU, conv
  floats += residual + deepest;                                                              // blocks, SiLU
  floats += 4 * quantizer_->dim() * area(levels - 1) + deepest;  // latent, quantizer, from_latent
  floats += residual;
  for (int64_t i = levels - 1; i >= 1; --i) floats += ch[i] * area(i) + ch[i - 1] * area(i - 1);  // SiLU, up
  floats += ch[0] * area(0) + options_.in_channels() * area(0);                                   // SiLU, the last conv
  return floats;
}

int64_t AutoencoderImpl::inference_floats_per_image(int64_t h, int64_t w) const {
  if (options_.architecture() == Architecture::Vqgan) {
    return std::max(vqgan::inference_floats(vqgan::encoder_layers(options_), h, w),
                    vqgan::inference_floats(vqgan::decoder_layers(options_), h, w)) +
           options_.in_channels() * h * w;
  }
  const auto& ch = options_.channels();
  int64_t widest = 0;
  for (size_t level = 0; level < ch.size(); ++level) {
    widest = std::max(widest, 2 * ch[level] * (h >> level) * (w >> level));
  }
  return widest + options_.in_channels() * h * w;
}

at::Tensor AutoencoderImpl::latent_tokens(const at::Tensor& x, int64_t* h, int64_t* w) {
  LOCKSTEP_CHECK_ARG(x.dim() == 4 && x.size(1) == options_.in_channels(), "model: expected images (b, ",
                     options_.in_channels(), ", h, w), got ", x.sizes());
  options_.check_image_size(x.size(2), x.size(3));
  const at::Tensor z = to_latent_(encoder_->forward(x));
  *h = z.size(2);
  *w = z.size(3);
  return quant::image_to_tokens(z);
}

at::Tensor AutoencoderImpl::output_weight() const {
  const auto* last = decoder_->ptr(decoder_->size() - 1)->as<nn::Conv2dImpl>();
  LOCKSTEP_THROW_IF_NOT(last != nullptr, InternalError, "model: the decoder does not end in a convolution");
  return last->weight;
}

at::Tensor AutoencoderImpl::decode_tokens(const at::Tensor& tokens, int64_t h, int64_t w) {
  return decoder_->forward(from_latent_(quant::tokens_to_image(tokens, h, w)));
}

at::Tensor AutoencoderImpl::indices_as_grid(const at::Tensor& indices, int64_t b, int64_t h, int64_t w) const {
  std::vector<int64_t> shape{b, h, w};
  if (indices.dim() == 3) shape.push_back(indices.size(2));
  return indices.reshape(shape);
}

AutoencoderOutput AutoencoderImpl::forward(const at::Tensor& x, const quant::QuantizeContext& ctx) {
  int64_t h = 0, w = 0;
  const at::Tensor tokens = latent_tokens(x, &h, &w);
  AutoencoderOutput out;
  {
    // The quantizer computes in float32 even inside an autocast region (train.precision = bf16).
    const quant::NoAutocast fp32;
    out.latents = tokens.to(at::kFloat);
    out.quant = quantizer_->quantize(out.latents, ctx);
  }
  out.quant.indices = indices_as_grid(out.quant.indices, x.size(0), h, w);
  out.reconstruction = decode_tokens(out.quant.quantized, h, w);
  return out;
}

at::Tensor AutoencoderImpl::latents(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  int64_t h = 0, w = 0;
  return latent_tokens(x, &h, &w).to(at::kFloat);
}

at::Tensor AutoencoderImpl::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  int64_t h = 0, w = 0;
  const at::Tensor tokens = latent_tokens(x, &h, &w);
  const quant::NoAutocast fp32;
  return indices_as_grid(quantizer_->encode(tokens.to(at::kFloat)), x.size(0), h, w);
}

at::Tensor AutoencoderImpl::decode(const at::Tensor& indices) {
  torch::NoGradGuard no_grad;
  const bool multi = quantizer_->num_indices() > 1;
  LOCKSTEP_CHECK_ARG(indices.dim() == (multi ? 4 : 3), "model: expected indices (b, h, w", multi ? ", k" : "",
                     "), got ", indices.sizes());
  const int64_t b = indices.size(0), h = indices.size(1), w = indices.size(2);
  const at::Tensor flat = multi ? indices.reshape({b, h * w, indices.size(3)}) : indices.reshape({b, h * w});
  at::Tensor vectors;
  {
    const quant::NoAutocast fp32;
    vectors = quantizer_->decode(flat);
  }
  return decode_tokens(vectors, h, w);
}

}  // namespace lockstep::model
