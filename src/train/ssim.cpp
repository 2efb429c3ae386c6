#include "lockstep/train/ssim.h"

#include <torch/torch.h>

#include <algorithm>

#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {
constexpr int64_t kWindow = 11;
constexpr double kSigma = 1.5, kC1 = 0.01 * 0.01, kC2 = 0.03 * 0.03;

// The normalised 1-d Gaussian of `size` taps; the 2-d window is its outer product, applied as two passes.
at::Tensor gaussian(int64_t size, const at::TensorOptions& options) {
  const at::Tensor t = torch::arange(size, options) - static_cast<double>(size - 1) / 2;
  const at::Tensor g = (-(t * t) / (2 * kSigma * kSigma)).exp();
  return g / g.sum();
}

// Each channel filtered by the window, over the positions where it fits whole.
at::Tensor filtered(const at::Tensor& x, const at::Tensor& g) {
  const int64_t c = x.size(1), n = g.size(0);
  const at::Tensor rows = g.view({1, 1, n, 1}).expand({c, 1, n, 1});
  const at::Tensor cols = g.view({1, 1, 1, n}).expand({c, 1, 1, n});
  const at::Tensor no_bias;
  const std::vector<int64_t> ones{1, 1}, zeros{0, 0};  // stride, padding, dilation
  const auto depthwise = [&](const at::Tensor& in, const at::Tensor& w) {
    return at::conv2d(in, w, no_bias, ones, zeros, ones, c);
  };
  return depthwise(depthwise(x, rows), cols);
}
}  // namespace

at::Tensor ssim_per_image(const at::Tensor& x_in, const at::Tensor& y_in) {
  LOCKSTEP_CHECK_ARG(x_in.dim() == 4 && x_in.sizes() == y_in.sizes(), "ssim: expected two (b, c, h, w) images of ",
                     "one shape, got ", x_in.sizes(), " and ", y_in.sizes());
  torch::NoGradGuard no_grad;
  const at::Tensor x = x_in.to(torch::kFloat64), y = y_in.to(torch::kFloat64);
  const at::Tensor g = gaussian(std::min({kWindow, x.size(2), x.size(3)}), x.options());
  const at::Tensor mx = filtered(x, g), my = filtered(y, g);
  const at::Tensor vx = filtered(x * x, g) - mx * mx, vy = filtered(y * y, g) - my * my;
  const at::Tensor cov = filtered(x * y, g) - mx * my;
  const at::Tensor map = (2 * mx * my + kC1) * (2 * cov + kC2) / ((mx * mx + my * my + kC1) * (vx + vy + kC2));
  return map.flatten(1).mean(1);
}

}  // namespace lockstep::train
