#include "lockstep/model/lpips.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "lockstep/core/error.h"

namespace lockstep::model {
namespace {
// VGG16's convolutions up to relu5_3, by slice (a 2x2 max pool opens slices 2-5) and by their
// index in torchvision's `features`, which the layout's names keep.
struct ConvSpec {
  int slice, index;
  int64_t in, out;
};
const std::vector<ConvSpec> kConvs = {{1, 0, 3, 64},     {1, 2, 64, 64},    {2, 5, 64, 128},   {2, 7, 128, 128},
                                      {3, 10, 128, 256}, {3, 12, 256, 256}, {3, 14, 256, 256}, {4, 17, 256, 512},
                                      {4, 19, 512, 512}, {4, 21, 512, 512}, {5, 24, 512, 512}, {5, 26, 512, 512},
                                      {5, 28, 512, 512}};
const std::vector<int64_t> kHeadChannels = {64, 128, 256, 512, 512};
// The input scaling of LPIPS v0.1 (ImageNet statistics, for images in [-1, 1]).
const std::vector<float> kShift = {-.030f, -.088f, -.188f};
const std::vector<float> kScale = {.458f, .448f, .450f};

std::string conv_name(const ConvSpec& c) { return detail::concat("net.slice", c.slice, ".", c.index); }
std::string head_name(size_t k) { return detail::concat("lin", k, ".model.1.weight"); }

const at::Tensor& take(const std::map<std::string, at::Tensor>& weights, const std::string& name,
                       const std::vector<int64_t>& shape, const std::string& origin) {
  auto it = weights.find(name);
  LOCKSTEP_CHECK_ARG(it != weights.end(), origin, ": no tensor '", name,
                     "'; an LPIPS-VGG weights file holds lpips.LPIPS(net='vgg').state_dict() (docs/losses.md)");
  LOCKSTEP_CHECK_ARG(it->second.sizes() == at::IntArrayRef(shape), origin, ": '", name, "' has shape ",
                     it->second.sizes(), ", LPIPS-VGG's is ", at::IntArrayRef(shape),
                     " (is it the weights of another backbone?)");
  LOCKSTEP_CHECK_ARG(it->second.is_floating_point(), origin, ": '", name, "' holds ", it->second.scalar_type(),
                     ", not floating-point values");
  return it->second;
}

at::Tensor constants(const std::vector<float>& values) {
  return torch::tensor(values, torch::kFloat32).reshape({1, 3, 1, 1});
}

// Each pixel's feature vector scaled to unit length (the eps as in LPIPS).
at::Tensor unit_features(const at::Tensor& f) { return f / (f.pow(2).sum(1, /*keepdim=*/true).sqrt() + 1e-10); }
}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> LpipsImpl::required_tensors() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& c : kConvs) {
    out.push_back({conv_name(c) + ".weight", {c.out, c.in, 3, 3}});
    out.push_back({conv_name(c) + ".bias", {c.out}});
  }
  for (size_t k = 0; k < kHeadChannels.size(); ++k) out.push_back({head_name(k), {1, kHeadChannels[k], 1, 1}});
  return out;
}

LpipsImpl::LpipsImpl(const std::map<std::string, at::Tensor>& weights, const std::string& origin) {
  std::set<std::string> known;
  auto buffer = [&](const std::string& name, const std::vector<int64_t>& shape) {
    known.insert(name);
    at::Tensor t = take(weights, name, shape, origin).to(torch::kFloat32).clone();
    std::string registered = name;
    std::replace(registered.begin(), registered.end(), '.', '_');  // module names cannot hold dots
    return register_buffer(registered, t);
  };
  for (const auto& c : kConvs) {
    conv_weights_.push_back(buffer(conv_name(c) + ".weight", {c.out, c.in, 3, 3}));
    conv_biases_.push_back(buffer(conv_name(c) + ".bias", {c.out}));
  }
  for (size_t k = 0; k < kHeadChannels.size(); ++k) {
    heads_.push_back(buffer(head_name(k), {1, kHeadChannels[k], 1, 1}));
    // The lpips package's state_dict names each head twice (lin0 and lins.0); both must agree.
    const std::string alias = detail::concat("lins.", k, ".model.1.weight");
    if (weights.count(alias)) {
      known.insert(alias);
      LOCKSTEP_CHECK_ARG(take(weights, alias, {1, kHeadChannels[k], 1, 1}, origin).to(torch::kFloat32).equal(heads_[k]),
                         origin, ": '", alias, "' differs from '", head_name(k), "'; they name the same head");
    }
  }
  shift_ = register_buffer("shift", constants(kShift));
  scale_ = register_buffer("scale", constants(kScale));
  for (const auto& [name, expected] :
       {std::pair{"scaling_layer.shift", shift_}, std::pair{"scaling_layer.scale", scale_}}) {
    if (!weights.count(name)) continue;
    known.insert(name);
    const at::Tensor given = take(weights, name, {1, 3, 1, 1}, origin).to(torch::kFloat32);
    LOCKSTEP_CHECK_ARG(given.allclose(expected, 0, 1e-6), origin, ": '", name, "' is ", given.flatten(),
                       ", LPIPS v0.1's is ", expected.flatten());
  }
  for (const auto& [name, tensor] : weights) {
    LOCKSTEP_CHECK_ARG(known.count(name), origin, ": '", name, "' is not part of the LPIPS-VGG layout",
                       " (its tensors are net.sliceS.I.weight/bias and linK.model.1.weight)");
  }
}

int64_t LpipsImpl::activation_floats_per_pair(int64_t h, int64_t w) {
  int64_t per_image = 3 * h * w;  // the scaled input
  int64_t differences = 0;
  for (size_t i = 0; i < kConvs.size(); ++i) {
    if (i > 0 && kConvs[i].slice != kConvs[i - 1].slice) {
      differences += 4 * kConvs[i - 1].out * h * w;  // two unit features, their difference, its square
      h /= 2;
      w /= 2;
      per_image += kConvs[i - 1].out * h * w;  // the pool's output
    }
    per_image += 2 * kConvs[i].out * h * w;  // convolution and ReLU outputs
  }
  differences += 4 * kConvs.back().out * h * w;
  return 2 * per_image + differences;
}

std::vector<at::Tensor> LpipsImpl::features(const at::Tensor& x) {
  std::vector<at::Tensor> out;
  at::Tensor h = (x - shift_) / scale_;
  for (size_t i = 0; i < kConvs.size(); ++i) {
    if (i > 0 && kConvs[i].slice != kConvs[i - 1].slice) {
      out.push_back(h);
      h = torch::max_pool2d(h, {2, 2}, {2, 2});
    }
    h = torch::relu(
        at::conv2d(h, conv_weights_[i], conv_biases_[i], std::vector<int64_t>{1, 1}, std::vector<int64_t>{1, 1}));
  }
  out.push_back(h);
  return out;
}

at::Tensor LpipsImpl::forward(const at::Tensor& x, const at::Tensor& y) {
  LOCKSTEP_CHECK_ARG(x.dim() == 4 && x.sizes() == y.sizes() && (x.size(1) == 1 || x.size(1) == 3), "lpips: expected ",
                     "two image batches (b, 1 or 3, h, w) of one shape, got ", x.sizes(), " and ", y.sizes());
  LOCKSTEP_CHECK_ARG(x.size(2) >= 16 && x.size(3) >= 16, "lpips: images of ", x.size(3), "x", x.size(2),
                     " are too small for VGG16's four poolings (16x16 at least)");
  const int64_t b = x.size(0);
  // One pass over both batches: half the calls, and the same arithmetic per image.
  at::Tensor both = torch::cat({x, y}).to(torch::kFloat32);
  if (both.size(1) == 1) both = both.expand({-1, 3, -1, -1});
  const std::vector<at::Tensor> f = features(both);
  at::Tensor distance = torch::zeros({b}, both.options());
  for (size_t k = 0; k < f.size(); ++k) {
    const at::Tensor diff = (unit_features(f[k].narrow(0, 0, b)) - unit_features(f[k].narrow(0, b, b))).pow(2);
    distance = distance + at::conv2d(diff, heads_[k]).mean({1, 2, 3});
  }
  return distance;
}

}  // namespace lockstep::model
