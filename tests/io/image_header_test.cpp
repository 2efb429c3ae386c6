// Image headers read without decoding: the sizes of files every encoder writes, hand-made headers
// of each layout (big-endian TIFF, BigTIFF, top-down BMP, PNM comments), and broken or hostile ones.
#include "lockstep/io/image_header.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/config_build.h"

#if LOCKSTEP_HAVE_OPENCV
#include <opencv2/imgcodecs.hpp>
#endif

namespace lockstep::io {
namespace {

std::string le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}
std::string be(uint64_t v, int bytes) {
  std::string out;
  for (int i = bytes - 1; i >= 0; --i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

void expect_size(const std::string& bytes, const std::string& format, int64_t width, int64_t height) {
  const ImageHeader h = read_image_header(bytes);
  EXPECT_EQ(h.error, "");
  EXPECT_EQ(h.format, format);
  EXPECT_EQ(h.width, width);
  EXPECT_EQ(h.height, height);
}

std::string png_header(uint32_t width, uint32_t height) {
  return std::string("\x89PNG\r\n\x1A\n", 8) + be(13, 4) + "IHDR" + be(width, 4) + be(height, 4) +
         std::string("\x08\x02\x00\x00\x00", 5) + be(0, 4);
}

TEST(ImageHeader, HandMadeHeadersOfEveryLayout) {
  expect_size(png_header(640, 480), "PNG", 640, 480);
  // JPEG: an APP0 segment, then a baseline frame header (precision 8, height 7, width 300).
  const std::string jpeg = std::string("\xFF\xD8\xFF\xE0", 4) + be(16, 2) + std::string(14, 'j') +
                           std::string("\xFF\xFF\xC0", 3) + be(11, 2) + "\x08" + be(7, 2) + be(300, 2) + "\x01";
  expect_size(jpeg, "JPEG", 300, 7);
  // WebP, each of its three first chunks.
  const std::string riff = "RIFF" + le(100, 4) + "WEBP";
  expect_size(riff + "VP8 " + le(50, 4) + std::string("\x00\x00\x00\x9D\x01\x2A", 6) + le(321, 2) + le(123, 2), "WebP",
              321, 123);
  expect_size(riff + "VP8L" + le(50, 4) + "\x2F" + le((199u) | (99u << 14), 4), "WebP", 200, 100);
  expect_size(riff + "VP8X" + le(10, 4) + le(0, 4) + le(4999, 3) + le(2999, 3), "WebP", 5000, 3000);
  // TIFF, little- and big-endian, SHORT and LONG sizes, and BigTIFF with LONG8.
  const std::string tiff_le = std::string("II*\0", 4) + le(8, 4) + le(2, 2) + le(256, 2) + le(3, 2) + le(1, 4) +
                              le(77, 2) + le(0, 2) + le(257, 2) + le(4, 2) + le(1, 4) + le(66, 4) + le(0, 4);
  expect_size(tiff_le, "TIFF", 77, 66);
  const std::string tiff_be = std::string("MM\0*", 4) + be(8, 4) + be(2, 2) + be(257, 2) + be(3, 2) + be(1, 4) +
                              be(55, 2) + be(0, 2) + be(256, 2) + be(4, 2) + be(1, 4) + be(44, 4) + be(0, 4);
  expect_size(tiff_be, "TIFF", 44, 55);
  const std::string big = std::string("II+\0", 4) + le(8, 2) + le(0, 2) + le(16, 8) + le(2, 8) + le(256, 2) +
                          le(16, 2) + le(1, 8) + le(1234, 8) + le(257, 2) + le(3, 2) + le(1, 8) + le(56, 8);
  expect_size(big, "TIFF", 1234, 56);
  // BMP: Windows (a negative height is top-down) and OS/2 1.x headers.
  const std::string bmp_file = "BM" + le(0, 4) + le(0, 4) + le(54, 4);
  expect_size(bmp_file + le(40, 4) + le(31, 4) + le(static_cast<uint32_t>(-17), 4) + std::string(28, '\0'), "BMP", 31,
              17);
  expect_size(bmp_file + le(12, 4) + le(9, 2) + le(8, 2) + le(1, 2) + le(24, 2), "BMP", 9, 8);
  // PNM with comments between the fields.
  expect_size("P6\n# made by hand\n 12 # width\n\t34\n255\n", "PNM", 12, 34);
}

TEST(ImageHeader, OversizedImagesAreRefusedByTheirHeaderWithTheFigures) {
  const ImageHeader h = read_image_header(png_header(30000, 30000));
  EXPECT_EQ(h.error, "");
  const std::string problem = image_header_problem(h);
  EXPECT_NE(problem.find("PNG of 30000x30000 pixels: over the limit of 268435456 pixels"), std::string::npos)
      << problem;
  EXPECT_EQ(image_header_problem(read_image_header(png_header(16384, 16384))), "");  // exactly the limit
  EXPECT_NE(image_header_problem(read_image_header(png_header(16384, 16385))), "");
}

TEST(ImageHeader, BrokenHeadersSayWhatIsWrongAndEveryPrefixIsSafe) {
  EXPECT_EQ(read_image_header("").error, "is empty");
  EXPECT_NE(read_image_header("GIF89a....").error.find("it starts with 47 49 46 38 39 61 2e 2e"), std::string::npos);
  EXPECT_NE(read_image_header(png_header(0, 5)).error.find("size of 0x5"), std::string::npos);
  const std::string sos_first = std::string("\xFF\xD8\xFF\xDA", 4) + be(8, 2) + std::string(6, 'x');
  EXPECT_NE(read_image_header(sos_first).error.find("no frame header"), std::string::npos);
  const std::string dnl = std::string("\xFF\xD8\xFF\xC0", 4) + be(11, 2) + "\x08" + be(0, 2) + be(10, 2) + "\x01";
  EXPECT_NE(read_image_header(dnl).error.find("DNL"), std::string::npos);
  const std::string far_ifd = std::string("II*\0", 4) + le(1u << 31, 4);
  EXPECT_NE(read_image_header(far_ifd).error.find("outside the file"), std::string::npos);
  const std::string huge_count = std::string("II*\0", 4) + le(8, 4) + le(0xFFFF, 2);
  EXPECT_NE(read_image_header(huge_count).error.find("runs past the end"), std::string::npos);
  EXPECT_NE(read_image_header("P5\n# no size\n").error.find("no width and height"), std::string::npos);
  EXPECT_NE(read_image_header("P5 99999999999 1 255\n").error.find("more than 10 digits"), std::string::npos);

  // Every prefix of a valid header is either the same size or an error, never a read past the end
  // (the ASan build checks the reads).
  const std::string jpeg = std::string("\xFF\xD8\xFF\xE1", 4) + be(6, 2) + "Exif" + std::string("\xFF\xC2", 2) +
                           be(11, 2) + "\x08" + be(5, 2) + be(6, 2) + "\x01";
  for (const std::string& whole : {png_header(3, 4), jpeg}) {
    for (size_t n = 0; n < whole.size(); ++n) {
      const ImageHeader h = read_image_header(whole.substr(0, n));
      EXPECT_TRUE(!h.error.empty() || (h.width > 0 && h.height > 0)) << n;
    }
  }
  expect_size(jpeg, "JPEG", 6, 5);  // a progressive frame (SOF2)
}

#if LOCKSTEP_HAVE_OPENCV
// The headers of what OpenCV's encoders write give the size it decodes.
TEST(ImageHeader, EveryEncoderFormatGivesTheDecodedSize) {
  const struct {
    const char* extension;
    const char* format;
    int type;
  } cases[] = {{".png", "PNG", CV_8UC3},   {".png", "PNG", CV_16UC1},  {".jpg", "JPEG", CV_8UC3},
               {".webp", "WebP", CV_8UC3}, {".tiff", "TIFF", CV_8UC3}, {".tiff", "TIFF", CV_16UC1},
               {".bmp", "BMP", CV_8UC3},   {".pgm", "PNM", CV_8UC1},   {".ppm", "PNM", CV_8UC3}};
  for (const auto& c : cases) {
    for (const cv::Size size : {cv::Size(37, 23), cv::Size(1, 300), cv::Size(513, 2)}) {
      std::vector<uchar> encoded;
      ASSERT_TRUE(cv::imencode(c.extension, cv::Mat(size, c.type, cv::Scalar::all(100)), encoded)) << c.extension;
      SCOPED_TRACE(std::string(c.extension) + " " + std::to_string(size.width) + "x" + std::to_string(size.height));
      expect_size(std::string(encoded.begin(), encoded.end()), c.format, size.width, size.height);
    }
  }
}
#else
TEST(NeedsOpenCV, ImageHeaderEncoderTests) {
  GTEST_SKIP() << "this build has no OpenCV (scripts/install-deps installs it): the encoder formats' headers "
                  "(tests/io/image_header_test.cpp) are not checked";
}
#endif

}  // namespace
}  // namespace lockstep::io
