// The VQGAN encoder and decoder (taming-transformers' Encoder and Decoder without the time
// embedding): GroupNorm residual blocks at every level, single-head self-attention at chosen levels,
// stride-2 convolutions down and nearest-neighbour upsampling with a convolution up. Private to
// src/model; AutoencoderImpl builds them for Architecture::Vqgan.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>

#include <vector>

#include "lockstep/model/autoencoder.h"

namespace lockstep::model::vqgan {

// GroupNorm -> SiLU -> conv3x3 (in -> out) -> GroupNorm -> SiLU -> conv3x3, added to the input,
// which goes through a 1x1 convolution when in != out.
struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in, int64_t out, int64_t groups);
  at::Tensor forward(const at::Tensor& x);  // x: (b, in, h, w) -> (b, out, h, w)

  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Conv2d shortcut{nullptr};  // only when in != out
};
TORCH_MODULE(ResBlock);

// Single-head self-attention over the h*w positions: with q, k, v the 1x1 convolutions of GroupNorm(x),
// x + proj_out(softmax(q^T k / sqrt(c)) applied to v).
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);  // x: (b, c, h, w) -> (b, c, h, w)

  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d q{nullptr}, k{nullptr}, v{nullptr}, proj_out{nullptr};
};
TORCH_MODULE(Attention);

// Halves height and width: one row and column of zeros at the bottom and right, then conv3x3 with
// stride 2 (taming's Downsample).
struct DownsampleImpl : torch::nn::Module {
  explicit DownsampleImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);  // x: (b, c, h, w) -> (b, c, h/2, w/2), h and w even

  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Downsample);

// Doubles height and width: nearest-neighbour, then conv3x3.
struct UpsampleImpl : torch::nn::Module {
  explicit UpsampleImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);  // x: (b, c, h, w) -> (b, c, 2h, 2w)

  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample);

// GroupNorm -> SiLU, before the last convolution of the encoder and of the decoder.
struct NormSiluImpl : torch::nn::Module {
  NormSiluImpl(int64_t channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);  // x: (b, c, h, w)

  torch::nn::GroupNorm norm{nullptr};
};
TORCH_MODULE(NormSilu);

// One layer of the encoder or the decoder, in order: the modules are built from these, and the
// memory estimates count them, so the two cannot drift apart.
struct Layer {
  enum class Kind { Conv3x3, ResBlock, Attention, Downsample, Upsample, NormSilu };
  Kind kind;
  int64_t in, out;  // channels
  int64_t level;    // resolution level of the input: h >> level by w >> level
};

// conv_in; per level res_blocks blocks (attention after each at attention_levels), a downsample
// between levels; the middle (block, [attention], block); GroupNorm -> SiLU. The convolution to the
// latent is AutoencoderImpl's to_latent.
std::vector<Layer> encoder_layers(const AutoencoderOptions& options);
// The mirror after from_latent: the middle; per level from the lowest res_blocks + 1 blocks
// (attention after each where configured), an upsample between levels; GroupNorm -> SiLU -> conv3x3
// to the image's channels.
std::vector<Layer> decoder_layers(const AutoencoderOptions& options);
torch::nn::Sequential build(const std::vector<Layer>& layers, int64_t groups);

// Floats a training step keeps per image of h x w: every tensor the layers create (autograd saves
// most of them for the backward pass), attention's two h*w x h*w matrices (scores and softmax) included.
int64_t activation_floats(const std::vector<Layer>& layers, int64_t h, int64_t w);
// A lower bound of the floats alive at once per image in a forward pass without gradients: the
// largest over the layers of their input and the temporaries alive with it.
int64_t inference_floats(const std::vector<Layer>& layers, int64_t h, int64_t w);

}  // namespace lockstep::model::vqgan
