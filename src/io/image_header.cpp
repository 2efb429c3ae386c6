#include "lockstep/io/image_header.h"

#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep::io {
namespace {

// Bounds-checked reads of the file's bytes: every parser below asks `has` before it reads.
class Bytes {
 public:
  explicit Bytes(const std::string& s) : b_(reinterpret_cast<const unsigned char*>(s.data())), n_(s.size()) {}
  size_t size() const { return n_; }
  bool has(uint64_t at, uint64_t count) const { return at <= n_ && count <= n_ - at; }
  unsigned char at(size_t i) const { return b_[i]; }
  bool starts(size_t at, const char* text) const {
    const size_t len = std::strlen(text);
    return has(at, len) && std::memcmp(b_ + at, text, len) == 0;
  }
  uint64_t be(size_t at, int count) const {
    uint64_t v = 0;
    for (int i = 0; i < count; ++i) v = (v << 8) | b_[at + i];
    return v;
  }
  uint64_t le(size_t at, int count) const {
    uint64_t v = 0;
    for (int i = count - 1; i >= 0; --i) v = (v << 8) | b_[at + i];
    return v;
  }

 private:
  const unsigned char* b_;
  size_t n_;
};

ImageHeader sized(const char* format, int64_t width, int64_t height) {
  ImageHeader h;
  h.format = format;
  if (width <= 0 || height <= 0) {
    h.error = detail::concat(format, " header gives a size of ", width, "x", height);
  } else {
    h.width = width;
    h.height = height;
  }
  return h;
}

ImageHeader broken(const char* format, const std::string& why) {
  ImageHeader h;
  h.format = format;
  h.error = detail::concat(format, " header ", why);
  return h;
}

ImageHeader png(const Bytes& b) {
  // Signature, then the IHDR chunk first: length 13, "IHDR", width and height big-endian.
  if (!b.has(8, 16) || !b.starts(12, "IHDR")) return broken("PNG", "has no IHDR chunk where the format puts it");
  return sized("PNG", static_cast<int64_t>(b.be(16, 4)), static_cast<int64_t>(b.be(20, 4)));
}

ImageHeader jpeg(const Bytes& b) {
  // Segments from SOI: FF, marker, then a 2-byte length for all but the standalone markers. The
  // frame header (SOFn) gives precision, height, width; a scan (SOS) before it means there is none.
  size_t i = 2;
  while (true) {
    if (!b.has(i, 1)) return broken("JPEG", "ends before its frame header (SOF)");
    if (b.at(i) != 0xFF) return broken("JPEG", detail::concat("has no marker at byte ", i));
    while (b.has(i, 1) && b.at(i) == 0xFF) ++i;
    if (!b.has(i, 1)) return broken("JPEG", "ends before its frame header (SOF)");
    const unsigned char marker = b.at(i++);
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (marker == 0xD9 || marker == 0xDA) return broken("JPEG", "has no frame header (SOF) before its image data");
    if (!b.has(i, 2)) return broken("JPEG", "ends inside a segment's length");
    const size_t length = b.be(i, 2);
    if (length < 2) return broken("JPEG", detail::concat("has a segment length of ", length, " at byte ", i));
    const bool frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (frame) {
      if (!b.has(i, 7)) return broken("JPEG", "ends inside its frame header");
      const auto height = static_cast<int64_t>(b.be(i + 3, 2));
      if (height == 0) return broken("JPEG", "leaves the height to a later DNL marker, which decoders do not support");
      return sized("JPEG", static_cast<int64_t>(b.be(i + 5, 2)), height);
    }
    i += length;
  }
}

ImageHeader webp(const Bytes& b) {
  // RIFF container; the first chunk is lossy (VP8), lossless (VP8L) or extended (VP8X).
  if (b.starts(12, "VP8 ")) {
    if (!b.has(20, 10) || b.at(23) != 0x9D || b.at(24) != 0x01 || b.at(25) != 0x2A)
      return broken("WebP", "has no VP8 key frame start code");
    return sized("WebP", static_cast<int64_t>(b.le(26, 2) & 0x3FFF), static_cast<int64_t>(b.le(28, 2) & 0x3FFF));
  }
  if (b.starts(12, "VP8L")) {
    if (!b.has(20, 5) || b.at(20) != 0x2F) return broken("WebP", "has no VP8L signature");
    const uint64_t bits = b.le(21, 4);
    return sized("WebP", static_cast<int64_t>((bits & 0x3FFF) + 1), static_cast<int64_t>(((bits >> 14) & 0x3FFF) + 1));
  }
  if (b.starts(12, "VP8X")) {
    if (!b.has(20, 10)) return broken("WebP", "ends inside its VP8X chunk");
    return sized("WebP", static_cast<int64_t>(b.le(24, 3) + 1), static_cast<int64_t>(b.le(27, 3) + 1));
  }
  return broken("WebP", "has no VP8, VP8L or VP8X chunk first");
}

ImageHeader tiff(const Bytes& b) {
  // Byte order mark, 42 (or 43 for BigTIFF), the first image file directory's offset; its entries
  // (tag, type, count, value) hold ImageWidth (256) and ImageLength (257) as SHORT, LONG or LONG8.
  const bool little = b.at(0) == 'I';
  auto num = [&](size_t at, int count) { return little ? b.le(at, count) : b.be(at, count); };
  const bool big = num(2, 2) == 43;
  if (big && (!b.has(4, 12) || num(4, 2) != 8)) return broken("TIFF", "(BigTIFF) has an unknown offset size");
  if (!big && !b.has(4, 4)) return broken("TIFF", "ends before its directory offset");
  const uint64_t ifd = big ? num(8, 8) : num(4, 4);
  const int count_size = big ? 8 : 2, entry_size = big ? 20 : 12, value_at = big ? 12 : 8;
  if (!b.has(ifd, count_size))
    return broken("TIFF", detail::concat("directory offset ", ifd, " lies outside the file"));
  const uint64_t entries = num(ifd, count_size);
  if (entries > b.size() || !b.has(ifd + count_size, entries * entry_size))
    return broken("TIFF", detail::concat("directory of ", entries, " entries runs past the end of the file"));
  int64_t width = -1, height = -1;
  for (uint64_t e = 0; e < entries; ++e) {
    const size_t at = ifd + count_size + e * entry_size;
    const uint64_t tag = num(at, 2), type = num(at + 2, 2);
    if (tag != 256 && tag != 257) continue;
    int64_t value;
    if (type == 3)
      value = static_cast<int64_t>(num(at + value_at, 2));
    else if (type == 4)
      value = static_cast<int64_t>(num(at + value_at, 4));
    else if (type == 16 && big && num(at + value_at, 8) <= uint64_t{1} << 32)
      value = static_cast<int64_t>(num(at + value_at, 8));
    else
      return broken("TIFF", detail::concat("gives tag ", tag, " the type ", type, " (not a size)"));
    (tag == 256 ? width : height) = value;
  }
  if (width < 0 || height < 0) return broken("TIFF", "has no ImageWidth and ImageLength in its first directory");
  return sized("TIFF", width, height);
}

ImageHeader bmp(const Bytes& b) {
  // File header (14 bytes), then the DIB header: its size says which; OS/2 1.x's has 16-bit sizes.
  if (!b.has(14, 4)) return broken("BMP", "ends before its DIB header");
  const uint64_t dib = b.le(14, 4);
  if (dib == 12) {
    if (!b.has(18, 4)) return broken("BMP", "ends inside its DIB header");
    return sized("BMP", static_cast<int64_t>(b.le(18, 2)), static_cast<int64_t>(b.le(20, 2)));
  }
  if (dib < 16 || !b.has(18, 8)) return broken("BMP", detail::concat("has a DIB header of ", dib, " bytes"));
  const auto width = static_cast<int32_t>(static_cast<uint32_t>(b.le(18, 4)));
  const auto height = static_cast<int32_t>(static_cast<uint32_t>(b.le(22, 4)));  // negative: top-down
  return sized("BMP", width, height == INT32_MIN ? 0 : (height < 0 ? -int64_t{height} : int64_t{height}));
}

ImageHeader pnm(const Bytes& b) {
  // "P1".."P6", then width and height in decimal, separated by whitespace and "#" comments.
  size_t i = 2;
  int64_t values[2];
  for (int64_t& v : values) {
    while (b.has(i, 1)) {
      const unsigned char c = b.at(i);
      if (c == '#') {
        while (b.has(i, 1) && b.at(i) != '\n' && b.at(i) != '\r') ++i;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
        ++i;
      } else {
        break;
      }
    }
    int digits = 0;
    v = 0;
    for (; b.has(i, 1) && b.at(i) >= '0' && b.at(i) <= '9'; ++i) {
      if (++digits > 10) return broken("PNM", "has a size of more than 10 digits");
      v = v * 10 + (b.at(i) - '0');
    }
    if (digits == 0) return broken("PNM", "has no width and height after its magic number");
  }
  return sized("PNM", values[0], values[1]);
}

}  // namespace

ImageHeader read_image_header(const std::string& bytes) {
  const Bytes b(bytes);
  if (b.starts(0, "\x89PNG\r\n\x1A\n")) return png(b);
  if (b.has(0, 3) && b.at(0) == 0xFF && b.at(1) == 0xD8 && b.at(2) == 0xFF) return jpeg(b);
  if (b.starts(0, "RIFF") && b.starts(8, "WEBP")) return webp(b);
  if (b.has(0, 4) && ((b.starts(0, "II") && b.at(3) == 0 && (b.at(2) == 42 || b.at(2) == 43)) ||
                      (b.starts(0, "MM") && b.at(2) == 0 && (b.at(3) == 42 || b.at(3) == 43))))
    return tiff(b);
  if (b.starts(0, "BM")) return bmp(b);
  if (b.has(0, 2) && b.at(0) == 'P' && b.at(1) >= '1' && b.at(1) <= '6') return pnm(b);

  ImageHeader h;
  std::string start;
  for (size_t i = 0; i < 8 && b.has(i, 1); ++i) {
    start += i ? " " : "";
    start += "0123456789abcdef"[b.at(i) >> 4];
    start += "0123456789abcdef"[b.at(i) & 15];
  }
  h.error = b.size() == 0
                ? std::string("is empty")
                : detail::concat("is not a PNG, JPEG, WebP, TIFF, BMP or PNM file (it starts with ", start, ")");
  return h;
}

std::string image_header_problem(const ImageHeader& header) {
  if (!header.error.empty()) return header.error;
  const uint64_t pixels = static_cast<uint64_t>(header.width) * static_cast<uint64_t>(header.height);
  if (pixels > kMaxImagePixels) {
    return detail::concat(header.format, " of ", header.width, "x", header.height, " pixels: over the limit of ",
                          kMaxImagePixels, " pixels for one image");
  }
  return "";
}

}  // namespace lockstep::io
