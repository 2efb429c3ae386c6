// Structural similarity (Wang, Bovik, Sheikh and Simoncelli 2004), as evaluations report it beside
// PSNR: an 11x11 Gaussian window (sigma 1.5), K1 = 0.01, K2 = 0.03, pixels in [0, 1], the map over
// the positions where the window fits whole, averaged over positions and channels. Images smaller
// than 11 pixels use a window of their shorter side.
#pragma once

#include <ATen/core/Tensor.h>

namespace lockstep::train {

// x, y: (b, c, h, w) with values in [0, 1], the same shape -> (b,) float64, one SSIM per image.
at::Tensor ssim_per_image(const at::Tensor& x, const at::Tensor& y);

}  // namespace lockstep::train
