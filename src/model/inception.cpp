#include "lockstep/model/inception.h"

#include <torch/torch.h>

#include <set>

#include "lockstep/core/error.h"

namespace lockstep::model {
namespace {
namespace nn = torch::nn;
namespace F = torch::nn::functional;

// Convolution without bias, BatchNorm (eps 0.001), ReLU: torchvision's BasicConv2d.
struct BasicConvImpl : nn::Module {
  BasicConvImpl(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride = {1, 1},
                std::vector<int64_t> padding = {0, 0})
      : conv(register_module(
            "conv", nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false)))),
        bn(register_module("bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(out).eps(0.001)))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::relu(bn(conv(x))); }
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
};
TORCH_MODULE(BasicConv);

BasicConv square(int64_t in, int64_t out, int64_t k, int64_t stride = 1, int64_t padding = 0) {
  return BasicConv(in, out, std::vector<int64_t>{k, k}, std::vector<int64_t>{stride, stride},
                   std::vector<int64_t>{padding, padding});
}
// A 1 x n (wide) or n x 1 (tall) convolution that keeps the size.
BasicConv wide(int64_t in, int64_t out, int64_t n) {
  return BasicConv(in, out, std::vector<int64_t>{1, n}, std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, n / 2});
}
BasicConv tall(int64_t in, int64_t out, int64_t n) {
  return BasicConv(in, out, std::vector<int64_t>{n, 1}, std::vector<int64_t>{1, 1}, std::vector<int64_t>{n / 2, 0});
}

// TensorFlow's average pool: the padding's zeros do not count.
at::Tensor average_pool_3x3(const at::Tensor& x) {
  return F::avg_pool2d(x, F::AvgPool2dFuncOptions(3).stride(1).padding(1).count_include_pad(false));
}
at::Tensor max_pool_3x3(const at::Tensor& x, int64_t stride, int64_t padding) {
  return F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(stride).padding(padding));
}

struct InceptionAImpl : nn::Module {
  InceptionAImpl(int64_t in, int64_t pool_features)
      : branch1x1(register_module("branch1x1", square(in, 64, 1))),
        branch5x5_1(register_module("branch5x5_1", square(in, 48, 1))),
        branch5x5_2(register_module("branch5x5_2", square(48, 64, 5, 1, 2))),
        branch3x3dbl_1(register_module("branch3x3dbl_1", square(in, 64, 1))),
        branch3x3dbl_2(register_module("branch3x3dbl_2", square(64, 96, 3, 1, 1))),
        branch3x3dbl_3(register_module("branch3x3dbl_3", square(96, 96, 3, 1, 1))),
        branch_pool(register_module("branch_pool", square(in, pool_features, 1))) {}
  at::Tensor forward(const at::Tensor& x) {
    return torch::cat({branch1x1(x), branch5x5_2(branch5x5_1(x)), branch3x3dbl_3(branch3x3dbl_2(branch3x3dbl_1(x))),
                       branch_pool(average_pool_3x3(x))},
                      1);
  }
  BasicConv branch1x1, branch5x5_1, branch5x5_2, branch3x3dbl_1, branch3x3dbl_2, branch3x3dbl_3, branch_pool;
};
TORCH_MODULE(InceptionA);

struct InceptionBImpl : nn::Module {
  explicit InceptionBImpl(int64_t in)
      : branch3x3(register_module("branch3x3", square(in, 384, 3, 2))),
        branch3x3dbl_1(register_module("branch3x3dbl_1", square(in, 64, 1))),
        branch3x3dbl_2(register_module("branch3x3dbl_2", square(64, 96, 3, 1, 1))),
        branch3x3dbl_3(register_module("branch3x3dbl_3", square(96, 96, 3, 2))) {}
  at::Tensor forward(const at::Tensor& x) {
    return torch::cat(
        {branch3x3(x), branch3x3dbl_3(branch3x3dbl_2(branch3x3dbl_1(x))), max_pool_3x3(x, /*stride=*/2, 0)}, 1);
  }
  BasicConv branch3x3, branch3x3dbl_1, branch3x3dbl_2, branch3x3dbl_3;
};
TORCH_MODULE(InceptionB);

struct InceptionCImpl : nn::Module {
  InceptionCImpl(int64_t in, int64_t c7)
      : branch1x1(register_module("branch1x1", square(in, 192, 1))),
        branch7x7_1(register_module("branch7x7_1", square(in, c7, 1))),
        branch7x7_2(register_module("branch7x7_2", wide(c7, c7, 7))),
        branch7x7_3(register_module("branch7x7_3", tall(c7, 192, 7))),
        branch7x7dbl_1(register_module("branch7x7dbl_1", square(in, c7, 1))),
        branch7x7dbl_2(register_module("branch7x7dbl_2", tall(c7, c7, 7))),
        branch7x7dbl_3(register_module("branch7x7dbl_3", wide(c7, c7, 7))),
        branch7x7dbl_4(register_module("branch7x7dbl_4", tall(c7, c7, 7))),
        branch7x7dbl_5(register_module("branch7x7dbl_5", wide(c7, 192, 7))),
        branch_pool(register_module("branch_pool", square(in, 192, 1))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor b7 = branch7x7_3(branch7x7_2(branch7x7_1(x)));
    const at::Tensor d7 = branch7x7dbl_5(branch7x7dbl_4(branch7x7dbl_3(branch7x7dbl_2(branch7x7dbl_1(x)))));
    return torch::cat({branch1x1(x), b7, d7, branch_pool(average_pool_3x3(x))}, 1);
  }
  BasicConv branch1x1, branch7x7_1, branch7x7_2, branch7x7_3, branch7x7dbl_1, branch7x7dbl_2, branch7x7dbl_3,
      branch7x7dbl_4, branch7x7dbl_5, branch_pool;
};
TORCH_MODULE(InceptionC);

struct InceptionDImpl : nn::Module {
  explicit InceptionDImpl(int64_t in)
      : branch3x3_1(register_module("branch3x3_1", square(in, 192, 1))),
        branch3x3_2(register_module("branch3x3_2", square(192, 320, 3, 2))),
        branch7x7x3_1(register_module("branch7x7x3_1", square(in, 192, 1))),
        branch7x7x3_2(register_module("branch7x7x3_2", wide(192, 192, 7))),
        branch7x7x3_3(register_module("branch7x7x3_3", tall(192, 192, 7))),
        branch7x7x3_4(register_module("branch7x7x3_4", square(192, 192, 3, 2))) {}
  at::Tensor forward(const at::Tensor& x) {
    return torch::cat({branch3x3_2(branch3x3_1(x)), branch7x7x3_4(branch7x7x3_3(branch7x7x3_2(branch7x7x3_1(x)))),
                       max_pool_3x3(x, /*stride=*/2, 0)},
                      1);
  }
  BasicConv branch3x3_1, branch3x3_2, branch7x7x3_1, branch7x7x3_2, branch7x7x3_3, branch7x7x3_4;
};
TORCH_MODULE(InceptionD);

// `max_pool`: the last block's pool branch (pytorch-fid's FIDInceptionE_2), else the average pool.
struct InceptionEImpl : nn::Module {
  InceptionEImpl(int64_t in, bool max_pool)
      : max_pool_branch(max_pool),
        branch1x1(register_module("branch1x1", square(in, 320, 1))),
        branch3x3_1(register_module("branch3x3_1", square(in, 384, 1))),
        branch3x3_2a(register_module("branch3x3_2a", wide(384, 384, 3))),
        branch3x3_2b(register_module("branch3x3_2b", tall(384, 384, 3))),
        branch3x3dbl_1(register_module("branch3x3dbl_1", square(in, 448, 1))),
        branch3x3dbl_2(register_module("branch3x3dbl_2", square(448, 384, 3, 1, 1))),
        branch3x3dbl_3a(register_module("branch3x3dbl_3a", wide(384, 384, 3))),
        branch3x3dbl_3b(register_module("branch3x3dbl_3b", tall(384, 384, 3))),
        branch_pool(register_module("branch_pool", square(in, 192, 1))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor b3 = branch3x3_1(x);
    const at::Tensor d3 = branch3x3dbl_2(branch3x3dbl_1(x));
    const at::Tensor pooled = max_pool_branch ? max_pool_3x3(x, 1, 1) : average_pool_3x3(x);
    return torch::cat({branch1x1(x), branch3x3_2a(b3), branch3x3_2b(b3), branch3x3dbl_3a(d3), branch3x3dbl_3b(d3),
                       branch_pool(pooled)},
                      1);
  }
  bool max_pool_branch;
  BasicConv branch1x1, branch3x3_1, branch3x3_2a, branch3x3_2b, branch3x3dbl_1, branch3x3dbl_2, branch3x3dbl_3a,
      branch3x3dbl_3b, branch_pool;
};
TORCH_MODULE(InceptionE);

nn::Functional pool_3x3_stride_2() {
  return nn::Functional([](at::Tensor t) { return max_pool_3x3(t, 2, 0); });
}
}  // namespace

FidInceptionImpl::FidInceptionImpl() { build(); }

void FidInceptionImpl::build() {
  // Registered under torchvision's names, so the state dict's keys are the module paths.
  nn::Sequential s;
  s->push_back("Conv2d_1a_3x3", square(3, 32, 3, 2));
  s->push_back("Conv2d_2a_3x3", square(32, 32, 3));
  s->push_back("Conv2d_2b_3x3", square(32, 64, 3, 1, 1));
  s->push_back("maxpool1", pool_3x3_stride_2());
  s->push_back("Conv2d_3b_1x1", square(64, 80, 1));
  s->push_back("Conv2d_4a_3x3", square(80, 192, 3));
  s->push_back("maxpool2", pool_3x3_stride_2());
  s->push_back("Mixed_5b", InceptionA(192, 32));
  s->push_back("Mixed_5c", InceptionA(256, 64));
  s->push_back("Mixed_5d", InceptionA(288, 64));
  s->push_back("Mixed_6a", InceptionB(288));
  s->push_back("Mixed_6b", InceptionC(768, 128));
  s->push_back("Mixed_6c", InceptionC(768, 160));
  s->push_back("Mixed_6d", InceptionC(768, 160));
  s->push_back("Mixed_6e", InceptionC(768, 192));
  s->push_back("Mixed_7a", InceptionD(768));
  s->push_back("Mixed_7b", InceptionE(1280, /*max_pool=*/false));
  s->push_back("Mixed_7c", InceptionE(2048, /*max_pool=*/true));
  blocks_ = s;
  // Registered flat: "Conv2d_1a_3x3.conv.weight", not "blocks.0.conv.weight".
  for (const auto& child : blocks_->named_children()) register_module(child.key(), child.value());
  // The classifier the weights carry (1008 ImageNet classes); FID reads the pooled features before it.
  register_module("fc", nn::Linear(2048, 1008));
  eval();
}

FidInceptionImpl::FidInceptionImpl(const std::map<std::string, at::Tensor>& weights, const std::string& origin) {
  build();
  torch::NoGradGuard no_grad;
  std::set<std::string> known;
  auto fill = [&](const std::string& name, at::Tensor& into) {
    known.insert(name);
    auto it = weights.find(name);
    LOCKSTEP_CHECK_ARG(it != weights.end(), origin, ": no tensor '", name,
                       "'; an FID Inception weights file holds pytorch-fid's pt_inception-2015-12-05 state dict "
                       "(docs/losses.md)");
    LOCKSTEP_CHECK_ARG(it->second.sizes() == into.sizes(), origin, ": '", name, "' has shape ", it->second.sizes(),
                       ", FID Inception's is ", into.sizes());
    into.copy_(it->second.to(into.scalar_type()));
  };
  for (auto& p : named_parameters(true)) fill(p.key(), p.value());
  for (auto& b : named_buffers(true)) fill(b.key(), b.value());
  for (const auto& [name, tensor] : weights) {
    LOCKSTEP_CHECK_ARG(known.count(name), origin, ": '", name, "' is not part of FID Inception's layout",
                       " (torchvision's Inception-v3 names without AuxLogits, e.g. Mixed_5b.branch1x1.conv.weight)");
  }
}

at::Tensor FidInceptionImpl::features(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 4 && (x.size(1) == 1 || x.size(1) == 3), "fid: expected images (b, 1 or 3, h, w), got ",
                     x.sizes());
  torch::NoGradGuard no_grad;
  at::Tensor h = x.to(torch::kFloat32);
  if (h.size(1) == 1) h = h.expand({-1, 3, -1, -1});
  // pytorch-fid resizes images in [0, 1] and then scales them to [-1, 1]; both are affine per pixel,
  // so resizing [-1, 1] images is the same.
  h = F::interpolate(
      h, F::InterpolateFuncOptions().size(std::vector<int64_t>{299, 299}).mode(torch::kBilinear).align_corners(false));
  return F::adaptive_avg_pool2d(blocks_->forward(h), F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
}

}  // namespace lockstep::model
