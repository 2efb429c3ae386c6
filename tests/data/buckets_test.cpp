#include "lockstep/data/buckets.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"

namespace lockstep::data {
namespace {

Manifest manifest_of(const std::vector<std::pair<int64_t, int64_t>>& sizes) {
  Manifest m;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ManifestEntry e;
    e.path = "img" + std::to_string(i);
    e.width = sizes[i].first;
    e.height = sizes[i].second;
    if (e.width == 0) e.error = "cannot be decoded";
    m.entries.push_back(e);
  }
  return m;
}

TEST(Buckets, ImagesGoToTheNearestAspectRatioAndUnreadableOnesToNone) {
  const auto table = default_bucket_table();  // 1:1, 9:7, 7:9, 10:7, 7:10, 2:1, 1:2
  const Manifest m = manifest_of({{512, 512}, {640, 480}, {480, 640}, {3000, 1500}, {100, 300}, {0, 0}, {700, 500}});
  const auto buckets = assign_buckets(m, table);
  ASSERT_EQ(buckets.size(), table.size());
  EXPECT_EQ(buckets[0], (std::vector<int64_t>{0}));  // square
  EXPECT_EQ(buckets[1], (std::vector<int64_t>{1}));  // 4:3 is nearest 9:7
  EXPECT_EQ(buckets[2], (std::vector<int64_t>{2}));
  EXPECT_EQ(buckets[3], (std::vector<int64_t>{6}));  // 7:5 = 1.4 is nearest 10:7
  EXPECT_EQ(buckets[5], (std::vector<int64_t>{3}));  // 2:1
  EXPECT_EQ(buckets[6], (std::vector<int64_t>{4}));  // 1:3 is nearest 1:2
  int64_t total = 0;
  for (const auto& b : buckets) total += static_cast<int64_t>(b.size());
  EXPECT_EQ(total, 6);  // the unreadable image is in no bucket
}

TEST(Buckets, TablesAreParsedAndCheckedWithTheValuesInTheMessage) {
  const auto t = parse_bucket_table("256x256,384x192");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[1].width, 384);
  EXPECT_EQ(t[1].height, 192);
  check_bucket_table(t, 32);
  check_bucket_table(default_bucket_table(), 32);
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message([] { parse_bucket_table("256x,128x128"); }).find("'256x' is not WIDTHxHEIGHT"), std::string::npos);
  EXPECT_NE(message([] { parse_bucket_table("256*256"); }).find("'256*256'"), std::string::npos);
  EXPECT_NE(message([] {
              check_bucket_table({{250, 256}}, 32);
            })
                .find("bucket 0 (250x256): each side must be a "
                      "positive multiple of 32"),
            std::string::npos);
  EXPECT_NE(message([] {
              check_bucket_table({{256, 128}, {512, 256}}, 32);
            }).find("same aspect ratio"),
            std::string::npos);
  EXPECT_NE(message([] { check_bucket_table({}, 32); }).find("empty"), std::string::npos);
}

#if LOCKSTEP_HAVE_OPENCV
TEST(Buckets, FittingCoversTheBucketAndCropsTheCentre) {
  // 40x20 image: left half 0, right half 200; a 10x10 bucket keeps the centre 20x20 scaled to 10x10.
  io::Image img;
  img.width = 40;
  img.height = 20;
  img.channels = 1;
  img.pixels.resize(800);
  for (int y = 0; y < 20; ++y) {
    for (int x = 0; x < 40; ++x) img.pixels[static_cast<size_t>(y * 40 + x)] = x < 20 ? 0 : 200;
  }
  const io::Image out = fit_to_bucket(img, {10, 10});
  ASSERT_EQ(out.width, 10);
  ASSERT_EQ(out.height, 10);
  EXPECT_EQ(out.pixels[0], 0);                        // left edge of the centre: dark
  EXPECT_EQ(out.pixels[9], 200);                      // right edge: bright
  const io::Image up = fit_to_bucket(img, {64, 64});  // upscaling covers too
  EXPECT_EQ(up.width, 64);
  EXPECT_EQ(up.height, 64);
  EXPECT_THROW(fit_to_bucket(io::Image{}, {8, 8}), InvalidArgument);
}

TEST(Buckets, APlacementMovesZoomsAndMirrorsTheWindow) {
  // 20x10 image whose column x holds 10 x: a 10x10 bucket needs no scaling, so windows are exact.
  io::Image img;
  img.width = 20;
  img.height = 10;
  img.channels = 1;
  for (int y = 0; y < 10; ++y) {
    for (int x = 0; x < 20; ++x) img.pixels.push_back(static_cast<uint8_t>(10 * x));
  }
  auto first_row = [](const io::Image& out) { return std::vector<int>(out.pixels.begin(), out.pixels.begin() + 10); };
  const std::vector<int> centre{50, 60, 70, 80, 90, 100, 110, 120, 130, 140};
  EXPECT_EQ(first_row(fit_to_bucket(img, {10, 10})), centre);
  FitPlacement left;
  left.x = 0;
  EXPECT_EQ(first_row(fit_to_bucket(img, {10, 10}, left)), (std::vector<int>{0, 10, 20, 30, 40, 50, 60, 70, 80, 90}));
  FitPlacement right_mirrored;
  right_mirrored.x = 1;
  right_mirrored.flip = true;
  EXPECT_EQ(first_row(fit_to_bucket(img, {10, 10}, right_mirrored)),
            (std::vector<int>{190, 180, 170, 160, 150, 140, 130, 120, 110, 100}));
  // Zoom 2 at the top left: the window covers about the first 5 columns of the original.
  FitPlacement zoomed;
  zoomed.zoom = 2;
  zoomed.x = 0;
  zoomed.y = 0;
  const io::Image z = fit_to_bucket(img, {10, 10}, zoomed);
  ASSERT_EQ(z.width, 10);
  EXPECT_LE(*std::max_element(z.pixels.begin(), z.pixels.end()), 50);
  FitPlacement bad;
  bad.zoom = 0.5;
  EXPECT_THROW(fit_to_bucket(img, {10, 10}, bad), InvalidArgument);
}
#endif

}  // namespace
}  // namespace lockstep::data
