#include "lockstep/data/batch.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::data {
namespace {
int64_t image_bytes(const ImageSet& set) { return int64_t{set.channels} * set.height * set.width; }

at::Tensor to_unit_range(const at::Tensor& bytes) { return bytes.to(torch::kFloat32).div_(127.5).sub_(1.0); }
}  // namespace

at::Tensor images_to_tensor(const ImageSet& set, const std::vector<int64_t>& indices) {
  const int64_t size = image_bytes(set);
  at::Tensor out =
      torch::empty({static_cast<int64_t>(indices.size()), set.channels, set.height, set.width}, torch::kUInt8);
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (size_t i = 0; i < indices.size(); ++i) {
    LOCKSTEP_CHECK_ARG(indices[i] >= 0 && indices[i] < set.count, "image index ", indices[i], " outside [0, ",
                       set.count, ")");
    std::memcpy(dst + i * size, set.pixels.data() + indices[i] * size, size);
  }
  return to_unit_range(out);
}

at::Tensor images_to_tensor(const ImageSet& set, int64_t first, int64_t count) {
  LOCKSTEP_CHECK_ARG(first >= 0 && count >= 0 && first + count <= set.count, "images [", first, ", ", first + count,
                     ") outside [0, ", set.count, ")");
  const at::Tensor bytes = torch::from_blob(const_cast<uint8_t*>(set.pixels.data()) + first * image_bytes(set),
                                            {count, set.channels, set.height, set.width}, torch::kUInt8);
  return to_unit_range(bytes);
}

std::vector<io::Image> tensor_to_images(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 4 && (x.size(1) == 1 || x.size(1) == 3), "expected (b, 1 or 3, h, w), got ", x.sizes());
  const at::Tensor bytes = ((x.detach().to(torch::kFloat32).clamp(-1, 1) + 1) * 127.5)
                               .round()
                               .to(torch::kUInt8)
                               .permute({0, 2, 3, 1})
                               .contiguous();
  std::vector<io::Image> images(x.size(0));
  const int64_t size = x.size(1) * x.size(2) * x.size(3);
  for (int64_t i = 0; i < x.size(0); ++i) {
    auto& img = images[i];
    img.width = static_cast<int>(x.size(3));
    img.height = static_cast<int>(x.size(2));
    img.channels = static_cast<int>(x.size(1));
    const uint8_t* src = bytes.data_ptr<uint8_t>() + i * size;
    img.pixels.assign(src, src + size);
  }
  return images;
}

ImageSet first_images(ImageSet set, int64_t count) {
  LOCKSTEP_CHECK_ARG(count >= 0, "image count ", count, " must be >= 0");
  if (count == 0 || count >= set.count) return set;
  set.pixels.resize(count * image_bytes(set));
  if (!set.labels.empty()) set.labels.resize(count);
  set.count = count;
  return set;
}

ImageSet image_set_from_images(const std::vector<io::Image>& images, int channels) {
  LOCKSTEP_CHECK_ARG(channels == 1 || channels == 3, "channels = ", channels, " must be 1 or 3");
  ImageSet set;
  set.count = static_cast<int64_t>(images.size());
  set.channels = channels;
  if (images.empty()) return set;
  set.height = images[0].height;
  set.width = images[0].width;
  const int64_t plane = int64_t{set.height} * set.width;
  set.pixels.resize(set.count * channels * plane);
  for (int64_t i = 0; i < set.count; ++i) {
    const io::Image& img = images[i];
    LOCKSTEP_CHECK_ARG(img.width == set.width && img.height == set.height && img.channels == channels, "image ", i,
                       " is ", img.width, "x", img.height, "x", img.channels, ", expected ", set.width, "x", set.height,
                       "x", channels);
    // Interleaved (h, w, c) to channel-first (c, h, w).
    for (int c = 0; c < channels; ++c) {
      for (int64_t p = 0; p < plane; ++p) {
        set.pixels[(i * channels + c) * plane + p] = img.pixels[p * channels + c];
      }
    }
  }
  return set;
}

}  // namespace lockstep::data
