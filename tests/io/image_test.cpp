#include "lockstep/io/image.h"

#include <gtest/gtest.h>
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <string>
#include <vector>

#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"

namespace {

using lockstep::io::Image;
using lockstep::io::load_png;
using lockstep::io::save_png;
using lockstep::test_util::TempDir;
using Bytes = std::vector<uint8_t>;

Image make_image(int w, int h, int c, Bytes pixels) { return Image{w, h, c, std::move(pixels)}; }

// Writes a PNG with libpng's low-level API, for the types the simplified writer cannot produce
// (palette with tRNS, 16-bit). `rows` hold each row's bytes exactly as PNG stores them.
bool write_raw_png(const std::string& path, int width, int bit_depth, int color_type, const std::vector<Bytes>& rows,
                   const std::vector<png_color>& palette = {}, const Bytes& trns = {}) {
  FILE* fp = std::fopen(path.c_str(), "wb");
  if (!fp) return false;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(fp);
    return false;
  }
  png_init_io(png, fp);
  png_set_IHDR(png, info, width, static_cast<png_uint_32>(rows.size()), bit_depth, color_type, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  if (!trns.empty()) png_set_tRNS(png, info, trns.data(), static_cast<int>(trns.size()), nullptr);
  png_write_info(png, info);
  for (const Bytes& row : rows) png_write_row(png, row.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return std::fclose(fp) == 0;
}

TEST(Png, GrayRoundTripIsExactAndReplicatesToRgb) {
  TempDir dir;
  Bytes pixels;
  for (int i = 0; i < 15; ++i) pixels.push_back(static_cast<uint8_t>(i * 17));
  save_png(dir.file("g.png"), make_image(5, 3, 1, pixels));
  const Image gray = load_png(dir.file("g.png"), 1);
  EXPECT_EQ(gray.width, 5);
  EXPECT_EQ(gray.height, 3);
  EXPECT_EQ(gray.channels, 1);
  EXPECT_EQ(gray.pixels, pixels);
  const Image rgb = load_png(dir.file("g.png"), 3);
  ASSERT_EQ(rgb.pixels.size(), 45u);
  for (std::size_t i = 0; i < 15; ++i) {
    EXPECT_EQ(rgb.pixels[i * 3], pixels[i]);
    EXPECT_EQ(rgb.pixels[i * 3 + 1], pixels[i]);
    EXPECT_EQ(rgb.pixels[i * 3 + 2], pixels[i]);
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"g.png"});
}

TEST(Png, RgbRoundTripIsExactAndConvertsToBt601Luma) {
  TempDir dir;
  const Bytes pixels = {255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255, 10, 200, 77, 0, 0, 0};
  save_png(dir.file("c.png"), make_image(3, 2, 3, pixels));
  EXPECT_EQ(load_png(dir.file("c.png"), 3).pixels, pixels);
  // round((299 r + 587 g + 114 b) / 1000)
  EXPECT_EQ(load_png(dir.file("c.png"), 1).pixels, (Bytes{76, 150, 29, 255, 129, 0}));
}

TEST(Png, RgbaIsCompositedOnBlack) {
  TempDir dir;
  const Bytes pixels = {200, 100, 50, 255, 200, 100, 50, 0, 100, 200, 255, 128};
  save_png(dir.file("a.png"), make_image(3, 1, 4, pixels));
  EXPECT_EQ(load_png(dir.file("a.png"), 3).pixels, (Bytes{200, 100, 50, 0, 0, 0, 50, 100, 128}));
  EXPECT_EQ(load_png(dir.file("a.png"), 1).pixels, (Bytes{124, 0, 88}));
}

TEST(Png, GrayAlphaIsCompositedOnBlack) {
  TempDir dir;
  ASSERT_TRUE(write_raw_png(dir.file("ga.png"), 2, 8, PNG_COLOR_TYPE_GRAY_ALPHA, {{200, 128, 90, 255}}));
  EXPECT_EQ(load_png(dir.file("ga.png"), 1).pixels, (Bytes{100, 90}));
  EXPECT_EQ(load_png(dir.file("ga.png"), 3).pixels, (Bytes{100, 100, 100, 90, 90, 90}));
}

TEST(Png, PaletteWithTransparencyExpands) {
  TempDir dir;
  const std::vector<png_color> palette = {{255, 0, 0}, {0, 0, 255}, {10, 20, 30}};
  ASSERT_TRUE(write_raw_png(dir.file("p.png"), 4, 8, PNG_COLOR_TYPE_PALETTE, {{0, 1, 2, 0}, {2, 2, 1, 0}}, palette,
                            {255, 0, 128}));
  const Image rgb = load_png(dir.file("p.png"), 3);
  EXPECT_EQ(rgb.width, 4);
  EXPECT_EQ(rgb.height, 2);
  EXPECT_EQ(rgb.pixels, (Bytes{255, 0,  0,  0, 0,  0,  5, 10, 15, 255, 0, 0,  //
                               5,   10, 15, 5, 10, 15, 0, 0,  0,  255, 0, 0}));
  EXPECT_EQ(load_png(dir.file("p.png"), 1).pixels, (Bytes{76, 0, 9, 76, 9, 9, 0, 76}));
}

// Without PNG_IMAGE_FLAG_16BIT_sRGB libpng treats 16-bit data as linear and 0x8080 becomes ~188.
TEST(Png, SixteenBitReducesTo8BitWithoutGammaShift) {
  TempDir dir;
  ASSERT_TRUE(write_raw_png(dir.file("rgb16.png"), 2, 16, PNG_COLOR_TYPE_RGB,
                            {{0xff, 0xff, 0x80, 0x80, 0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0xff, 0xff}}));
  EXPECT_EQ(load_png(dir.file("rgb16.png"), 3).pixels, (Bytes{255, 128, 0, 64, 0, 255}));
  ASSERT_TRUE(write_raw_png(dir.file("g16.png"), 3, 16, PNG_COLOR_TYPE_GRAY, {{0x80, 0x80, 0x40, 0x40, 0xff, 0xff}}));
  EXPECT_EQ(load_png(dir.file("g16.png"), 1).pixels, (Bytes{128, 64, 255}));
}

TEST(Png, LowBitDepthGrayScalesTo8Bit) {
  TempDir dir;
  // Four 2-bit pixels 0, 1, 2, 3 packed into one byte.
  ASSERT_TRUE(write_raw_png(dir.file("g2.png"), 4, 2, PNG_COLOR_TYPE_GRAY, {{0b00011011}}));
  EXPECT_EQ(load_png(dir.file("g2.png"), 1).pixels, (Bytes{0, 85, 170, 255}));
}

TEST(Png, InvalidFilesThrowCorruptInputNamingThePath) {
  TempDir dir;
  lockstep::test_util::write_bytes(dir.file("text.png"), "this is not a png file at all");
  Bytes noise(std::size_t{64} * 64 * 3);
  for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<uint8_t>((i * 7919) % 256);
  save_png(dir.file("full.png"), make_image(64, 64, 3, noise));
  const std::string full = lockstep::io::read_file(dir.file("full.png"));
  lockstep::test_util::write_bytes(dir.file("cut.png"), full.substr(0, full.size() / 2));
  for (const char* name : {"text.png", "cut.png"}) {
    try {
      load_png(dir.file(name), 3);
      FAIL() << "expected CorruptInput for " << name;
    } catch (const lockstep::CorruptInput& e) {
      EXPECT_NE(std::string(e.what()).find(dir.file(name)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(load_png(dir.file("missing.png"), 3), lockstep::IoError);
  EXPECT_THROW(load_png(dir.file("full.png"), 2), lockstep::InvalidArgument);
}

TEST(Png, SaveRejectsInconsistentImagesAndUnwritablePaths) {
  TempDir dir;
  EXPECT_THROW(save_png(dir.file("x.png"), make_image(2, 2, 1, Bytes(3))), lockstep::InvalidArgument);
  EXPECT_THROW(save_png(dir.file("x.png"), make_image(2, 2, 2, Bytes(8))), lockstep::InvalidArgument);
  EXPECT_THROW(save_png(dir.file("x.png"), make_image(0, 2, 1, Bytes())), lockstep::InvalidArgument);
  EXPECT_THROW(save_png(dir.file("no/such/dir/x.png"), make_image(1, 1, 1, Bytes(1))), lockstep::IoError);
  EXPECT_TRUE(dir.entries().empty());
}

TEST(ImageTile, PlacesImagesInAGridWithPadding) {
  const std::vector<Image> images = {make_image(2, 2, 1, Bytes(4, 10)), make_image(2, 2, 1, Bytes(4, 20)),
                                     make_image(2, 2, 1, Bytes(4, 30))};
  const Image grid = lockstep::io::tile_images(images, 2, 1, 255);
  EXPECT_EQ(grid.width, 5);
  EXPECT_EQ(grid.height, 5);
  EXPECT_EQ(grid.channels, 1);
  EXPECT_EQ(grid.pixels, (Bytes{10,  10,  255, 20,  20,   //
                                10,  10,  255, 20,  20,   //
                                255, 255, 255, 255, 255,  //
                                30,  30,  255, 255, 255,  //
                                30,  30,  255, 255, 255}));
  // More columns than images: the grid is only as wide as it needs to be.
  const Image row = lockstep::io::tile_images(images, 10, 0);
  EXPECT_EQ(row.width, 6);
  EXPECT_EQ(row.height, 2);
  EXPECT_EQ(row.pixels, (Bytes{10, 10, 20, 20, 30, 30, 10, 10, 20, 20, 30, 30}));
}

TEST(ImageTile, KeepsChannelsInterleaved) {
  const Image a = make_image(1, 1, 3, {1, 2, 3});
  const Image b = make_image(1, 1, 3, {4, 5, 6});
  const Image grid = lockstep::io::tile_images({a, b}, 2, 1, 0);
  EXPECT_EQ(grid.pixels, (Bytes{1, 2, 3, 0, 0, 0, 4, 5, 6}));
}

TEST(ImageTile, RejectsMismatchedOrMissingImages) {
  const Image a = make_image(2, 2, 1, Bytes(4));
  const Image b = make_image(2, 3, 1, Bytes(6));
  EXPECT_THROW(lockstep::io::tile_images({a, b}, 2), lockstep::InvalidArgument);
  EXPECT_THROW(lockstep::io::tile_images({}, 2), lockstep::InvalidArgument);
  EXPECT_THROW(lockstep::io::tile_images({a}, 0), lockstep::InvalidArgument);
  EXPECT_THROW(lockstep::io::tile_images({a}, 1, -1), lockstep::InvalidArgument);
}

}  // namespace
