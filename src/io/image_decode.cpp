#include "lockstep/io/image_decode.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/io/image_header.h"

#if LOCKSTEP_HAVE_OPENCV
#include <jpeglib.h>
// jerror.h after jpeglib.h, which it needs; it names the warning codes (JWRN_EXTRANEOUS_DATA).
#include <jerror.h>

#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <vector>
#endif

namespace lockstep::io {
namespace {

#if LOCKSTEP_HAVE_OPENCV
// Any decoded cv::Mat -> 8-bit `channels` (1 or 3, RGB order) interleaved.
Image to_image(cv::Mat m, int channels) {
  if (m.depth() == CV_16U)
    m.convertTo(m, CV_8U, 1.0 / 257.0);
  else if (m.depth() != CV_8U)
    m.convertTo(m, CV_8U);
  if (m.channels() == 4) {  // composite on black: rgb * alpha / 255
    std::vector<cv::Mat> planes;
    cv::split(m, planes);
    for (int c = 0; c < 3; ++c) cv::multiply(planes[c], planes[3], planes[c], 1.0 / 255.0);
    planes.pop_back();
    cv::merge(planes, m);
  }
  cv::Mat out;
  if (channels == 1) {
    if (m.channels() == 3)
      cv::cvtColor(m, out, cv::COLOR_BGR2GRAY);
    else
      out = m;
  } else {
    if (m.channels() == 1)
      cv::cvtColor(m, out, cv::COLOR_GRAY2RGB);
    else
      cv::cvtColor(m, out, cv::COLOR_BGR2RGB);
  }
  Image image;
  image.width = out.cols;
  image.height = out.rows;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(out.total()) * channels);
  const cv::Mat contiguous = out.isContinuous() ? out : out.clone();
  std::copy(contiguous.data, contiguous.data + image.pixels.size(), image.pixels.begin());
  return image;
}

#endif

// A PNG's chunks (4-byte length, 4-byte type, data, 4-byte CRC) from the signature on: calls
// visit(offset, length) for each whose 8-byte header lies in `bytes`, up to IEND; true when IEND is
// reached.
template <typename Visit>
bool walk_png_chunks(const std::string& bytes, Visit visit) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t at = 8; at + 8 <= bytes.size();) {
    const uint64_t length =
        (uint64_t{b[at]} << 24) | (uint64_t{b[at + 1]} << 16) | (uint64_t{b[at + 2]} << 8) | uint64_t{b[at + 3]};
    visit(at, length);
    if (bytes.compare(at + 4, 4, "IEND") == 0) return true;
    at += 12 + length;
  }
  return false;
}

// Why a JPEG or PNG is cut short, or "" when it is complete (or another format, or broken in a way
// the decoder judges). libjpeg decodes a truncated JPEG without an error, filling the rest with
// grey; libpng prints to stderr before it fails. Checking first makes both a clean, named error.
std::string truncation_error(const std::string& bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (n >= 2 && b[0] == 0xFF && b[1] == 0xD8) {
    // Walk the segments from SOI to EOI: marker FF xx, then a 2-byte length for most; a scan
    // (SOS) is followed by entropy-coded data, in which FF is always followed by 00 or a restart
    // marker, up to the next marker. Running out of bytes before EOI means the file was cut short.
    // Segments carry their lengths, so an EXIF thumbnail is skipped whole; bytes after EOI are not read.
    const std::string cut = detail::concat("truncated JPEG: no end-of-image marker (", n, " bytes)");
    auto is_restart = [](unsigned char m) { return m >= 0xD0 && m <= 0xD7; };
    size_t i = 2;
    while (true) {
      if (i >= n) return cut;
      if (b[i] != 0xFF) return "";        // not a marker where one must be: let the decoder judge
      while (i < n && b[i] == 0xFF) ++i;  // fill bytes
      if (i >= n) return cut;
      const unsigned char marker = b[i++];
      if (marker == 0xD9) return "";                       // EOI
      if (marker == 0x01 || is_restart(marker)) continue;  // no length
      if (i + 2 > n) return cut;
      i += (size_t{b[i]} << 8) | b[i + 1];
      if (marker == 0xDA) {
        while (i + 1 < n && !(b[i] == 0xFF && b[i + 1] != 0x00 && !is_restart(b[i + 1]))) ++i;
        if (i + 1 >= n) return cut;
      }
    }
  }
  if (n >= 8 && bytes.compare(0, 8, "\x89PNG\r\n\x1A\n") == 0 && !walk_png_chunks(bytes, [](size_t, uint64_t) {})) {
    return detail::concat("truncated PNG: its chunks run past the end of the file (", n, " bytes) before IEND");
  }
  return "";
}

#if LOCKSTEP_HAVE_OPENCV
// A PNG without its ancillary chunks but those that change the pixels (tRNS: transparency). libpng
// warns on stderr about colour profiles and text chunks (once per file, on every rank), and lockstep
// uses none of them. Bytes that are not a well-formed chunk sequence are passed on unchanged.
std::string without_png_metadata(const std::string& bytes) {
  std::string out = bytes.substr(0, 8);
  bool whole = true;
  const bool ended = walk_png_chunks(bytes, [&](size_t at, uint64_t length) {
    if (12 + length > bytes.size() - at) whole = false;                             // a chunk cut short
    const bool critical = (static_cast<unsigned char>(bytes[at + 4]) & 0x20) == 0;  // an upper-case first letter
    if (whole && (critical || bytes.compare(at + 4, 4, "tRNS") == 0)) out.append(bytes, at, 12 + length);
  });
  return ended && whole ? out : bytes;
}

// libjpeg's error manager, made to keep its words: a fatal error jumps back to the decode, and the
// first warning (corrupt data, which libjpeg decodes around, and which OpenCV would let it print to
// stderr, once per image on every rank) is kept to make the image unreadable by name.
struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg passes a pointer to it, which is a pointer to this
  std::jmp_buf jump;
  char fatal[JMSG_LENGTH_MAX];
  char warning[JMSG_LENGTH_MAX];
};

void jpeg_fatal(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->fatal);
  std::longjmp(errors->jump, 1);
}

void jpeg_message(j_common_ptr info, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  // Bytes between the last scan and the end marker, which some cameras write, leave the image whole.
  const bool padding_before_end = info->err->msg_code == JWRN_EXTRANEOUS_DATA && info->err->msg_parm.i[1] == 0xD9;
  if (level < 0 && !padding_before_end && errors->warning[0] == '\0') {
    (*info->err->format_message)(info, errors->warning);
  }
}

// Decodes a JPEG into `out` (BGR or gray, as OpenCV would) with libjpeg: false with `errors` filled
// when it fails or warns. Nothing here has a destructor the longjmp could skip; `out` is the caller's.
bool decode_jpeg(const std::string& bytes, cv::Mat* out, JpegErrors* errors) {
  jpeg_decompress_struct info;
  info.err = jpeg_std_error(&errors->mgr);
  errors->mgr.error_exit = jpeg_fatal;
  errors->mgr.emit_message = jpeg_message;
  errors->fatal[0] = errors->warning[0] = '\0';
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  const bool gray = info.num_components == 1;
  info.out_color_space = gray ? JCS_GRAYSCALE : JCS_EXT_BGR;
  jpeg_start_decompress(&info);
  out->create(static_cast<int>(info.output_height), static_cast<int>(info.output_width), gray ? CV_8UC1 : CV_8UC3);
  while (info.output_scanline < info.output_height && errors->warning[0] == '\0') {
    JSAMPROW row = out->ptr<unsigned char>(static_cast<int>(info.output_scanline));
    jpeg_read_scanlines(&info, &row, 1);
  }
  if (errors->warning[0] == '\0') jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return errors->warning[0] == '\0';
}

// Why libpng cannot read a PNG's pixels, or "" when it can. OpenCV's decoder gives libpng handlers
// that print "libpng error: ..." to stderr before it fails; the simplified API used here keeps the
// message, so every PNG is read through it first (its header already within lockstep's limits).
std::string png_damage(const std::string& bytes) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  bool read = png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()) != 0;
  if (read) {
    image.format = PNG_FORMAT_GA;  // every row decoded, at 2 bytes a pixel, alpha kept (no compositing)
    std::vector<unsigned char> scratch(PNG_IMAGE_SIZE(image));
    read = png_image_finish_read(&image, nullptr, scratch.data(), 0, nullptr) != 0;
  }
  const std::string damage = read ? "" : image.message[0] != '\0' ? image.message : "unreadable";
  png_image_free(&image);
  return damage;
}

// Decodes, or returns an empty Mat and says why in `error`: a header over lockstep's limits is
// refused before OpenCV allocates anything.
cv::Mat decode_bytes(const std::string& bytes, std::string* error) {
  *error = image_header_problem(read_image_header(bytes));
  if (error->empty()) *error = truncation_error(bytes);
  if (!error->empty()) return cv::Mat();
  // JPEGs in three or one channels through libjpeg itself (its warnings kept, not printed); CMYK
  // and YCCK ones, which libjpeg cannot turn into BGR, through OpenCV.
  if (bytes.size() >= 3 && bytes.compare(0, 3, "\xFF\xD8\xFF") == 0) {
    cv::Mat decoded;
    JpegErrors errors;
    if (decode_jpeg(bytes, &decoded, &errors)) return decoded;
    if (errors.warning[0] != '\0') {
      *error = detail::concat("corrupt (libjpeg: ", errors.warning, ")");
      return cv::Mat();
    }
    if (std::strstr(errors.fatal, "color conversion") == nullptr) {
      *error = detail::concat("cannot be decoded (libjpeg: ", errors.fatal, ")");
      return cv::Mat();
    }
  }
  const bool png = bytes.compare(0, 4, "\x89PNG") == 0;
  const std::string cleaned = png ? without_png_metadata(bytes) : std::string();
  const std::string& input = png ? cleaned : bytes;
  if (png) {
    const std::string damage = png_damage(input);
    if (!damage.empty()) {
      *error = detail::concat("corrupt (libpng: ", damage, ")");
      return cv::Mat();
    }
  }
  const cv::Mat raw(1, static_cast<int>(input.size()), CV_8UC1, const_cast<char*>(input.data()));
  cv::Mat decoded;
  try {
    decoded = cv::imdecode(raw, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception&) {
    // OpenCV throws for some broken files and returns an empty Mat for others.
  }
  if (decoded.empty()) *error = "cannot be decoded (corrupt, or a format this OpenCV lacks)";
  return decoded;
}
#endif

}  // namespace

std::string read_image_bytes(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);  // a sparse 12 GB file is not read
  LOCKSTEP_THROW_IF_NOT(ec || size <= kMaxImageFileBytes, CorruptInput, path, ": ", size, " bytes, over the limit of ",
                        kMaxImageFileBytes, " bytes for one image file");
  return read_file(path);
}

std::string image_decoder_version() {
#if LOCKSTEP_HAVE_OPENCV
  return std::string("OpenCV ") + CV_VERSION;
#else
  return "";
#endif
}

bool is_image_file(const std::string& name) {
  std::string ext = std::filesystem::path(name).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::vector<std::string> known = {".png",  ".jpg", ".jpeg", ".webp", ".tif",
                                                 ".tiff", ".bmp", ".pgm",  ".ppm",  ".pnm"};
  return std::find(known.begin(), known.end(), ext) != known.end();
}

ImageProbe probe_image(const std::string& bytes) {
  ImageProbe probe;
#if !LOCKSTEP_HAVE_OPENCV
  probe.error = "cannot be decoded: this build of lockstep has no OpenCV";
#else
  const cv::Mat decoded = decode_bytes(bytes, &probe.error);
  if (!decoded.empty()) {
    probe.width = decoded.cols;
    probe.height = decoded.rows;
  }
#endif
  return probe;
}

Image decode_image(const std::string& path, int channels) {
  LOCKSTEP_CHECK_ARG(channels == 1 || channels == 3, "decode_image: channels = ", channels, " must be 1 or 3");
#if !LOCKSTEP_HAVE_OPENCV
  throw InvalidArgument(detail::concat("cannot decode ", path, ": this build of lockstep has no OpenCV"));
#else
  std::string error;
  const cv::Mat decoded = decode_bytes(read_image_bytes(path), &error);
  LOCKSTEP_THROW_IF_NOT(!decoded.empty(), CorruptInput, "cannot decode image ", path, ": ", error);
  return to_image(decoded, channels);
#endif
}

}  // namespace lockstep::io
