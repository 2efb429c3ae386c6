// An image file's format and size read from its header alone, so that a folder of images is
// checked against lockstep's limits before anything is decoded or allocated (a 2.6 MB PNG can
// claim 30000x30000 pixels). Formats: the ones image folders read (io/image_decode.h).
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::io {

// Limits for one image in a folder: its pixels (16384 x 16384) and its file's size.
constexpr uint64_t kMaxImagePixels = uint64_t{1} << 28;
constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 30;

struct ImageHeader {
  std::string format;  // "PNG", "JPEG", "WebP", "TIFF", "BMP", "PNM"; "" when not recognised
  int64_t width = 0;
  int64_t height = 0;
  std::string error;  // why the header cannot be read ("" when format, width and height are set)
};

// Reads the header at the start of `bytes` (a whole file, or at least its first 64 KiB: a JPEG's
// frame header may follow large metadata segments). Never throws; never reads past `bytes`.
ImageHeader read_image_header(const std::string& bytes);

// "" when the header is readable and within kMaxImagePixels, else why the image is refused
// ("PNG of 30000x30000 pixels: over the limit of 268435456 pixels").
std::string image_header_problem(const ImageHeader& header);

}  // namespace lockstep::io
