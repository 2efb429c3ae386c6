// A convolutional autoencoder for images: encoder -> quantizer -> decoder. Resolution halves at
// every level after the first; the quantizer sees one token per pixel of the lowest level. Two
// architectures: a small one (conv) and taming-transformers' VQGAN (docs/models.md).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include <memory>
#include <string>
#include <vector>

#include "lockstep/quant/quantizer.h"

namespace lockstep::model {

// Conv: strided convolutions, residual blocks only at the lowest resolution. Vqgan: GroupNorm
// residual blocks at every level, self-attention at chosen levels (src/model/vqgan_blocks.h).
enum class Architecture { Conv, Vqgan };
// "conv" or "vqgan"; anything else is an InvalidArgument that lists them.
Architecture parse_architecture(const std::string& name);

struct AutoencoderOptions {
  AutoencoderOptions(int64_t in_channels, std::vector<int64_t> channels)
      : in_channels_(in_channels), channels_(std::move(channels)) {}

  AutoencoderOptions& architecture(Architecture a) {
    architecture_ = a;
    return *this;
  }
  // Conv: residual blocks at the lowest resolution, in encoder and decoder. Vqgan: at every level,
  // in the encoder (at least 1), and one more per level in the decoder.
  AutoencoderOptions& res_blocks(int64_t n) {
    res_blocks_ = n;
    return *this;
  }
  // Conv only: BatchNorm before each activation of the residual blocks: statistics of the batch in
  // training, running estimates (buffers) in evaluation.
  AutoencoderOptions& batch_norm(bool on) {
    batch_norm_ = on;
    return *this;
  }
  // Vqgan only: levels (0 = full resolution) with self-attention after each residual block.
  AutoencoderOptions& attention_levels(std::vector<int64_t> levels) {
    attention_levels_ = std::move(levels);
    return *this;
  }
  // Vqgan only: self-attention between the two middle blocks at the lowest resolution.
  AutoencoderOptions& mid_attention(bool on) {
    mid_attention_ = on;
    return *this;
  }
  // Vqgan only: GroupNorm groups; every level's channel count must be a multiple.
  AutoencoderOptions& norm_groups(int64_t n) {
    norm_groups_ = n;
    return *this;
  }

  int64_t in_channels() const { return in_channels_; }
  const std::vector<int64_t>& channels() const { return channels_; }
  Architecture architecture() const { return architecture_; }
  int64_t res_blocks() const { return res_blocks_; }
  bool batch_norm() const { return batch_norm_; }
  const std::vector<int64_t>& attention_levels() const { return attention_levels_; }
  bool mid_attention() const { return mid_attention_; }
  int64_t norm_groups() const { return norm_groups_; }
  // Factor by which height and width shrink: 2^(levels - 1).
  int64_t downsampling() const { return int64_t{1} << (channels_.size() - 1); }

  // Throws InvalidArgument with the values (no levels, channels < 1, res_blocks < 0; for vqgan also
  // batch_norm, res_blocks < 1, channels not a multiple of norm_groups, attention levels out of range
  // or repeated; attention levels with conv).
  void validate() const;
  // Throws InvalidArgument when an h x w image cannot pass through (not divisible).
  void check_image_size(int64_t height, int64_t width) const;

 private:
  int64_t in_channels_;
  std::vector<int64_t> channels_;
  Architecture architecture_ = Architecture::Conv;
  int64_t res_blocks_ = 1;
  bool batch_norm_ = false;
  std::vector<int64_t> attention_levels_;
  bool mid_attention_ = true;
  int64_t norm_groups_ = 32;
};

struct AutoencoderOutput {
  at::Tensor reconstruction;     // (b, c, h, w)
  quant::QuantizerOutput quant;  // indices as (b, h', w') or (b, h', w', k)
  at::Tensor latents;            // (b, h'*w', dim) float32: the tokens the quantizer was given
};

class AutoencoderImpl : public torch::nn::Module {
 public:
  AutoencoderImpl(AutoencoderOptions options, std::shared_ptr<quant::Quantizer> quantizer);

  // x: (b, c, h, w) scaled to [-1, 1].
  AutoencoderOutput forward(const at::Tensor& x, const quant::QuantizeContext& ctx);
  // x: (b, c, h, w) -> the tokens forward hands the quantizer, (b, h'*w', dim) float32; no gradient.
  at::Tensor latents(const at::Tensor& x);
  // x: (b, c, h, w) -> indices (b, h', w') or (b, h', w', k); no gradient, no state change.
  at::Tensor encode(const at::Tensor& x);
  // indices from encode -> reconstruction (b, c, h, w).
  at::Tensor decode(const at::Tensor& indices);

  const AutoencoderOptions& options() const { return options_; }
  // The weight of the decoder's last convolution, the one that writes the image (where VQGAN's
  // adaptive weight compares gradients).
  at::Tensor output_weight() const;
  quant::Quantizer& quantizer() { return *quantizer_; }

  // Floats a training step keeps alive per image of h x w (every module's output, which autograd
  // saves for the backward pass): what the trainer checks against memory before its first step.
  // Measured: 0.95 of the resident growth per image on Fashion-MNIST with the default model. For
  // vqgan, every tensor its layers create, attention's h*w x h*w matrices included.
  int64_t activation_floats_per_image(int64_t h, int64_t w) const;
  // A lower bound of the floats alive at once per image during a forward pass without gradients
  // (encode, decode): the widest layer's input and output (and temporaries), and the image.
  int64_t inference_floats_per_image(int64_t h, int64_t w) const;

 private:
  void build_conv();
  void build_vqgan();
  at::Tensor latent_tokens(const at::Tensor& x, int64_t* h, int64_t* w);
  at::Tensor decode_tokens(const at::Tensor& tokens, int64_t h, int64_t w);
  at::Tensor indices_as_grid(const at::Tensor& indices, int64_t b, int64_t h, int64_t w) const;

  AutoencoderOptions options_;
  torch::nn::Sequential encoder_{nullptr};
  torch::nn::Conv2d to_latent_{nullptr};
  std::shared_ptr<quant::Quantizer> quantizer_;
  torch::nn::Conv2d from_latent_{nullptr};
  torch::nn::Sequential decoder_{nullptr};
};
TORCH_MODULE(Autoencoder);

}  // namespace lockstep::model
