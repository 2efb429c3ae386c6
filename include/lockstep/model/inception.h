// The Inception-v3 network of FID (Heusel et al. 2017) as pytorch-fid builds it: torchvision's
// Inception-v3 with the TensorFlow graph's quirks (average pools that leave padding out, a max pool
// in the last block), giving 2048 pooled features per image. The weights come from the user in the
// layout of pytorch-fid's `pt_inception-2015-12-05` state dict (docs/losses.md).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>

namespace lockstep::model {

class FidInceptionImpl : public torch::nn::Module {
 public:
  // Random weights (torch's initialisation): for tests and for the layout's names and shapes.
  FidInceptionImpl();
  // Throws InvalidArgument naming `origin` for a missing tensor, a shape that differs, or a name the
  // layout does not have.
  FidInceptionImpl(const std::map<std::string, at::Tensor>& weights, const std::string& origin);

  // x: (b, c, h, w) in [-1, 1], c = 1 (shown as grey RGB) or 3; resized to 299x299 (bilinear) as
  // pytorch-fid does. Returns (b, 2048) float32 features. Runs in evaluation mode, without gradients.
  at::Tensor features(const at::Tensor& x);

 private:
  void build();
  torch::nn::Sequential blocks_{nullptr};
};
TORCH_MODULE(FidInception);

}  // namespace lockstep::model
