// LPIPS with the VGG16 backbone (Zhang et al. 2018, "The Unreasonable Effectiveness of Deep
// Features as a Perceptual Metric"): a perceptual distance between images, used as a training loss
// and as an evaluation figure. The weights come from the user, in the layout of the `lpips`
// package's `LPIPS(net='vgg').state_dict()` (docs/losses.md says how to make the file).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::model {

class LpipsImpl : public torch::nn::Module {
 public:
  // The tensors the layout holds, with their shapes: the 13 VGG16 convolutions
  // (`net.sliceS.I.weight`/`.bias`) and the five 1x1 heads (`linK.model.1.weight`).
  static std::vector<std::pair<std::string, std::vector<int64_t>>> required_tensors();

  // Throws InvalidArgument naming `origin` for a missing tensor, a shape that differs (another
  // backbone, say) or a name the layout does not have. Optional extras it checks and accepts: the
  // scaling constants (`scaling_layer.shift`, `.scale`) and the heads' second names (`lins.K...`).
  LpipsImpl(const std::map<std::string, at::Tensor>& weights, const std::string& origin);

  // x, y: (b, c, h, w) in [-1, 1], c = 1 (shown as grey RGB) or 3, h and w >= 16. Returns the b
  // distances. Gradients flow to x and y, never to the weights (buffers, not parameters).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y);
  // Floats a training step keeps alive for backward per compared pair of h x w images (both
  // images' VGG16 activations and the per-layer differences): for the trainer's memory check.
  static int64_t activation_floats_per_pair(int64_t h, int64_t w);

 private:
  std::vector<at::Tensor> features(const at::Tensor& x);

  std::vector<at::Tensor> conv_weights_, conv_biases_, heads_;
  at::Tensor shift_, scale_;
};
TORCH_MODULE(Lpips);

}  // namespace lockstep::model
