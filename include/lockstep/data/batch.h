// Turning 8-bit images into model input and back.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "lockstep/data/image_set.h"
#include "lockstep/io/image.h"

namespace lockstep::data {

// Images `indices` of `set` as float (b, c, h, w) scaled to [-1, 1].
at::Tensor images_to_tensor(const ImageSet& set, const std::vector<int64_t>& indices);
// The `count` images starting at `first`.
at::Tensor images_to_tensor(const ImageSet& set, int64_t first, int64_t count);
// x: (b, c, h, w) in [-1, 1] (clamped) -> 8-bit images.
std::vector<io::Image> tensor_to_images(const at::Tensor& x);
// The first `count` images of `set` (all of them when count is 0 or exceeds the set).
ImageSet first_images(ImageSet set, int64_t count);
// Converts 8-bit images of one size (gray or RGB) to an ImageSet with `channels` channels.
ImageSet image_set_from_images(const std::vector<io::Image>& images, int channels);

}  // namespace lockstep::data
