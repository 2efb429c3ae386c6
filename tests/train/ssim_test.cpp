#include "lockstep/train/ssim.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {

// The definition written out window by window, in doubles: the reference the convolutions must match.
double brute_force_ssim(const at::Tensor& x, const at::Tensor& y) {
  const int64_t c = x.size(0), h = x.size(1), w = x.size(2), n = std::min<int64_t>({11, h, w});
  std::vector<double> g(n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += g[i] = std::exp(-std::pow(i - (n - 1) / 2.0, 2) / (2 * 1.5 * 1.5));
  for (double& v : g) v /= total;
  auto px = x.accessor<float, 3>();
  auto py = y.accessor<float, 3>();
  double sum = 0;
  int64_t count = 0;
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t top = 0; top + n <= h; ++top) {
      for (int64_t left = 0; left + n <= w; ++left) {
        double mx = 0, my = 0, xx = 0, yy = 0, xy = 0;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const double weight = g[i] * g[j], a = px[ch][top + i][left + j], b = py[ch][top + i][left + j];
            mx += weight * a, my += weight * b, xx += weight * a * a, yy += weight * b * b, xy += weight * a * b;
          }
        }
        const double c1 = 1e-4, c2 = 9e-4;
        sum += (2 * mx * my + c1) * (2 * (xy - mx * my) + c2) /
               ((mx * mx + my * my + c1) * (xx - mx * mx + yy - my * my + c2));
        ++count;
      }
    }
  }
  return sum / static_cast<double>(count);
}

TEST(Ssim, MatchesTheDefinitionWindowByWindow) {
  torch::manual_seed(3);
  const at::Tensor x = torch::rand({2, 3, 20, 17});
  const at::Tensor y = (x + 0.1 * torch::randn_like(x)).clamp(0, 1);
  const at::Tensor got = ssim_per_image(x, y);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2}));
  for (int64_t i = 0; i < 2; ++i) EXPECT_NEAR(got[i].item<double>(), brute_force_ssim(x[i], y[i]), 1e-9) << i;
  // Images smaller than the window use a window of their shorter side.
  const at::Tensor small = torch::rand({1, 1, 6, 9});
  EXPECT_NEAR(ssim_per_image(small, small.flip(3))[0].item<double>(), brute_force_ssim(small[0], small[0].flip(2)),
              1e-9);
}

TEST(Ssim, IdenticalImagesScoreOneConstantOnesTheLuminanceTermAndNoiseLess) {
  const at::Tensor x = torch::rand({1, 1, 28, 28});
  EXPECT_NEAR(ssim_per_image(x, x)[0].item<double>(), 1.0, 1e-12);
  // Constant images: no variance, so SSIM = (2ab + C1) / (a^2 + b^2 + C1).
  const double a = 0.3f, b = 0.7f, c1 = 1e-4;  // the float32 pixel values
  EXPECT_NEAR(ssim_per_image(torch::full({1, 1, 16, 16}, a), torch::full({1, 1, 16, 16}, b))[0].item<double>(),
              (2 * a * b + c1) / (a * a + b * b + c1), 1e-9);
  const double mild = ssim_per_image(x, (x + 0.05 * torch::randn_like(x)).clamp(0, 1))[0].item<double>();
  const double strong = ssim_per_image(x, (x + 0.3 * torch::randn_like(x)).clamp(0, 1))[0].item<double>();
  EXPECT_LT(strong, mild);
  EXPECT_LT(mild, 1.0);
}

TEST(Ssim, ShapesMustAgree) {
  EXPECT_THROW(ssim_per_image(torch::rand({1, 1, 8, 8}), torch::rand({1, 1, 8, 9})), InvalidArgument);
  EXPECT_THROW(ssim_per_image(torch::rand({8, 8}), torch::rand({8, 8})), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::train
