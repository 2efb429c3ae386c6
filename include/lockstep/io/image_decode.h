// Decoding image files through OpenCV (JPEG, PNG with palette, alpha or 16 bits, grayscale, WebP,
// TIFF, BMP, PNM) when this build has it, with truncated JPEGs and PNGs refused by name rather
// than decoded with grey or a warning on stderr.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/io/image.h"

namespace lockstep::io {

// "OpenCV 4.6.0" when this build decodes images, "" when it was built without OpenCV.
std::string image_decoder_version();

// True for the file names the image folders read (by extension, any case).
bool is_image_file(const std::string& name);

// The bytes of an image file. Throws IoError naming the file when it cannot be read.
std::string read_image_bytes(const std::string& path);

// What decoding `bytes` (one file's) found: its size, or why it cannot be decoded.
struct ImageProbe {
  int64_t width = 0;  // 0 when it cannot be decoded
  int64_t height = 0;
  std::string error;  // empty when it decodes ("truncated JPEG: ...", "cannot be decoded (...)")
};
ImageProbe probe_image(const std::string& bytes);

// Decodes to 8-bit `channels` (1 or 3): 16-bit samples scaled down, alpha composited on black (as
// io::load_png), gray replicated, colour to luma for 1 channel. Throws CorruptInput naming the file
// when it cannot be decoded, IoError when it cannot be read.
Image decode_image(const std::string& path, int channels);

}  // namespace lockstep::io
