#include "lockstep/data/batch.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::data {
namespace {

ImageSet ramp(int64_t count, int channels, int h, int w) {
  ImageSet s;
  s.count = count;
  s.channels = channels;
  s.height = h;
  s.width = w;
  for (int64_t i = 0; i < count * channels * h * w; ++i) s.pixels.push_back(static_cast<uint8_t>(i * 7 % 256));
  for (int64_t i = 0; i < count; ++i) s.labels.push_back(static_cast<uint8_t>(i));
  return s;
}

TEST(Batch, PixelsMapToMinusOneToOneAndBack) {
  ImageSet s = ramp(3, 1, 4, 5);
  s.pixels[0] = 0;
  s.pixels[1] = 255;
  const at::Tensor x = images_to_tensor(s, std::vector<int64_t>{2, 0});
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{2, 1, 4, 5}));
  EXPECT_FLOAT_EQ(x[1][0][0][0].item<float>(), -1.0f);
  EXPECT_FLOAT_EQ(x[1][0][0][1].item<float>(), 1.0f);
  // Image 2 comes first, and converting back gives its exact bytes.
  const auto images = tensor_to_images(x);
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0].pixels, std::vector<uint8_t>(s.pixels.begin() + 40, s.pixels.begin() + 60));
  EXPECT_TRUE(torch::equal(images_to_tensor(s, 1, 2), images_to_tensor(s, std::vector<int64_t>{1, 2})));
  EXPECT_THROW(images_to_tensor(s, std::vector<int64_t>{3}), InvalidArgument);
  EXPECT_THROW(images_to_tensor(s, 2, 2), InvalidArgument);
}

TEST(Batch, ChannelFirstSetsBecomeInterleavedImagesAndBack) {
  const ImageSet s = ramp(2, 3, 2, 3);
  const auto images = tensor_to_images(images_to_tensor(s, 0, 2));
  // Pixel (y=1, x=2) channel 1 of image 1: channel-first offset 1*18 + 1*6 + 1*3 + 2.
  EXPECT_EQ(images[1].pixels[(1 * 3 + 2) * 3 + 1], s.pixels[18 + 6 + 5]);
  const ImageSet back = image_set_from_images(images, 3);
  EXPECT_EQ(back.pixels, s.pixels);
  EXPECT_THROW(image_set_from_images(images, 1), InvalidArgument);
}

TEST(Batch, FirstImagesKeepsPixelsAndLabelsTogether) {
  const ImageSet s = ramp(5, 1, 2, 2);
  const ImageSet f = first_images(s, 2);
  EXPECT_EQ(f.count, 2);
  EXPECT_EQ(f.pixels, std::vector<uint8_t>(s.pixels.begin(), s.pixels.begin() + 8));
  EXPECT_EQ(f.labels, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(first_images(s, 0).count, 5);
  EXPECT_EQ(first_images(s, 9).count, 5);
  EXPECT_THROW(first_images(s, -1), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::data
