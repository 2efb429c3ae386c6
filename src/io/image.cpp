#include "lockstep/io/image.h"

#include <png.h>

#include <algorithm>
#include <cstring>

#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"

namespace lockstep::io {
namespace {

// Refuse to allocate for absurd sizes from a corrupt header (libpng alone allows 1e6 x 1e6).
constexpr uint64_t kMaxPixels = uint64_t{1} << 28;

void check_image(const Image& image) {
  LOCKSTEP_CHECK_ARG(image.width > 0 && image.height > 0, "image size ", image.width, "x", image.height,
                     " must be positive");
  LOCKSTEP_CHECK_ARG(image.channels == 1 || image.channels == 3 || image.channels == 4, "image has ", image.channels,
                     " channels; expected 1, 3 or 4");
  const uint64_t need = uint64_t(image.width) * uint64_t(image.height) * uint64_t(image.channels);
  LOCKSTEP_CHECK_ARG(image.pixels.size() == need, "image ", image.width, "x", image.height, "x", image.channels,
                     " needs ", need, " pixel bytes but has ", image.pixels.size());
}

// Frees libpng's state when a read or write is abandoned part-way.
struct PngImage {
  png_image png;
  PngImage() {
    std::memset(&png, 0, sizeof png);
    png.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&png); }
  std::string message() const { return png.message[0] ? png.message : "unknown libpng error"; }
};

// Straight (not premultiplied) alpha composited on black, in the stored sRGB values.
uint8_t over_black(uint8_t c, uint8_t a) { return static_cast<uint8_t>((c * a + 127) / 255); }

// ITU-R BT.601 luma, the weights PIL's convert("L") uses, so values match common Python tools.
uint8_t luma(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000);
}

}  // namespace

void save_png(const std::string& path, const Image& image) { write_file_atomic(path, encode_png(image, path)); }

std::string encode_png(const Image& image, const std::string& path) {
  check_image(image);
  PngImage p;
  p.png.width = static_cast<png_uint_32>(image.width);
  p.png.height = static_cast<png_uint_32>(image.height);
  p.png.format = image.channels == 1 ? PNG_FORMAT_GRAY : image.channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  // The first call only measures; the second writes into a buffer of that size.
  if (!png_image_write_get_memory_size(p.png, size, 0, image.pixels.data(), 0, nullptr)) {
    throw IoError(detail::concat("cannot encode PNG for '", path, "': ", p.message()));
  }
  std::string bytes(size, '\0');
  if (!png_image_write_to_memory(&p.png, bytes.data(), &size, 0, image.pixels.data(), 0, nullptr)) {
    throw IoError(detail::concat("cannot encode PNG for '", path, "': ", p.message()));
  }
  bytes.resize(size);
  return bytes;
}

Image load_png(const std::string& path, int channels) {
  LOCKSTEP_CHECK_ARG(channels == 1 || channels == 3, "load_png: channels must be 1 or 3, got ", channels);
  const std::string bytes = read_file(path);
  PngImage p;
  if (!png_image_begin_read_from_memory(&p.png, bytes.data(), bytes.size())) {
    throw CorruptInput(detail::concat(path, ": not a valid PNG: ", p.message()));
  }
  const bool colour = (p.png.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const uint64_t pixels = uint64_t(p.png.width) * p.png.height;
  LOCKSTEP_THROW_IF_NOT(pixels <= kMaxPixels, CorruptInput, path, ": PNG size ", p.png.width, "x", p.png.height,
                        " exceeds the limit of ", kMaxPixels, " pixels");
  // libpng otherwise treats 16-bit files without gAMA as linear light and darkens them on reduction.
  p.png.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
  // Reading everything as 8-bit RGBA lets us composite and convert the same way for every PNG type.
  p.png.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(pixels * 4);
  if (!png_image_finish_read(&p.png, nullptr, rgba.data(), 0, nullptr)) {
    throw CorruptInput(detail::concat(path, ": corrupt PNG data: ", p.message()));
  }

  Image out;
  out.width = static_cast<int>(p.png.width);
  out.height = static_cast<int>(p.png.height);
  out.channels = channels;
  out.pixels.resize(pixels * static_cast<uint64_t>(channels));
  for (uint64_t i = 0; i < pixels; ++i) {
    const uint8_t* px = &rgba[i * 4];
    const uint8_t r = over_black(px[0], px[3]), g = over_black(px[1], px[3]), b = over_black(px[2], px[3]);
    if (channels == 3) {
      out.pixels[i * 3] = r;
      out.pixels[i * 3 + 1] = g;
      out.pixels[i * 3 + 2] = b;
    } else {
      out.pixels[i] = colour ? luma(r, g, b) : r;  // gray input came back replicated: keep it exact
    }
  }
  return out;
}

Image tile_images(const std::vector<Image>& images, int columns, int padding, uint8_t background) {
  LOCKSTEP_CHECK_ARG(!images.empty(), "tile_images: no images");
  LOCKSTEP_CHECK_ARG(columns > 0, "tile_images: columns must be positive, got ", columns);
  LOCKSTEP_CHECK_ARG(padding >= 0, "tile_images: padding must be non-negative, got ", padding);
  const Image& first = images.front();
  for (std::size_t i = 0; i < images.size(); ++i) {
    const Image& im = images[i];
    check_image(im);
    LOCKSTEP_CHECK_ARG(im.width == first.width && im.height == first.height && im.channels == first.channels,
                       "tile_images: image ", i, " is ", im.width, "x", im.height, "x", im.channels, " but image 0 is ",
                       first.width, "x", first.height, "x", first.channels);
  }
  const int n = static_cast<int>(images.size());
  const int cols = std::min(columns, n);
  const int rows = (n + cols - 1) / cols;
  Image out;
  out.channels = first.channels;
  out.width = cols * first.width + (cols - 1) * padding;
  out.height = rows * first.height + (rows - 1) * padding;
  out.pixels.assign(std::size_t(out.width) * out.height * out.channels, background);
  const std::size_t row_bytes = std::size_t(first.width) * first.channels;
  for (int k = 0; k < n; ++k) {
    const int x0 = (k % cols) * (first.width + padding);
    const int y0 = (k / cols) * (first.height + padding);
    for (int y = 0; y < first.height; ++y) {
      const uint8_t* src = &images[k].pixels[std::size_t(y) * row_bytes];
      uint8_t* dst = &out.pixels[(std::size_t(y0 + y) * out.width + x0) * out.channels];
      std::copy(src, src + row_bytes, dst);
    }
  }
  return out;
}

}  // namespace lockstep::io
