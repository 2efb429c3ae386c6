// 8-bit images in memory and as PNG files (through libpng).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::io {

// Interleaved 8-bit pixels, row-major: pixels[(y * width + x) * channels + c].
struct Image {
  int width = 0;
  int height = 0;
  int channels = 1;  // 1 (gray), 3 (RGB) or 4 (RGBA)
  std::vector<uint8_t> pixels;
};

// Writes atomically. Throws InvalidArgument for an inconsistent Image, IoError when unwritable.
void save_png(const std::string& path, const Image& image);
// The bytes of a PNG file of `image` (what save_png writes); `name` is for the error, as in save_png's.
std::string encode_png(const Image& image, const std::string& name);
// Reads any PNG (palette, alpha, 16-bit, gray) converted to `channels` (1 or 3): alpha is
// composited on black, gray is replicated, colour is converted to luma for 1 channel.
// Throws IoError when unreadable and CorruptInput naming the file when it is not a valid PNG.
Image load_png(const std::string& path, int channels);

// Places `images` (all the same size and channel count) in a grid of `columns` with `padding`
// pixels of value `background` between them.
Image tile_images(const std::vector<Image>& images, int columns, int padding = 2, uint8_t background = 255);

}  // namespace lockstep::io
