// A PatchGAN discriminator (Isola et al. 2017; the one VQGAN trains beside its autoencoder): strided
// 4x4 convolutions whose every output judges one patch of the image. GroupNorm stands where VQGAN
// has BatchNorm, so that nothing depends on a rank's own batch and W ranks train as one process.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

namespace lockstep::model {

struct DiscriminatorOptions {
  explicit DiscriminatorOptions(int64_t in_channels) : in_channels_(in_channels) {}
  DiscriminatorOptions& channels(int64_t n) {
    channels_ = n;
    return *this;
  }
  DiscriminatorOptions& layers(int64_t n) {
    layers_ = n;
    return *this;
  }
  int64_t in_channels_;
  int64_t channels_ = 64;  // of the first layer; doubling per layer up to 8x
  int64_t layers_ = 3;     // stride-2 layers
};

class DiscriminatorImpl : public torch::nn::Module {
 public:
  // Weights drawn as VQGAN draws them (normal, std 0.02) from torch's generator.
  explicit DiscriminatorImpl(DiscriminatorOptions options);

  // x: (b, c, h, w) in [-1, 1] -> logits (b, 1, h', w'), one per patch.
  at::Tensor forward(const at::Tensor& x);
  // Throws InvalidArgument when h x w images leave no patch (each side must be >= 3 x 2^layers).
  void check_image_size(int64_t height, int64_t width) const;
  // Floats one forward keeps alive for backward per h x w image (each layer's convolution, norm and
  // activation outputs): for the trainer's memory check.
  int64_t activation_floats_per_image(int64_t height, int64_t width) const;

  const DiscriminatorOptions& options() const { return options_; }

  // LeCam regularisation's moving averages of the mean logits on real and on reconstructed images
  // (buffers: in the checkpoint, and equal on every rank because they follow global means).
  at::Tensor lecam_real, lecam_fake;

 private:
  DiscriminatorOptions options_;
  torch::nn::Sequential layers_{nullptr};
};
TORCH_MODULE(Discriminator);

}  // namespace lockstep::model
