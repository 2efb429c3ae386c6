// Resolution / aspect-ratio buckets: every readable image of a manifest goes to the
// bucket whose aspect ratio is nearest its own, and is resized to cover the bucket's size and
// centre-cropped to it, so one global batch is one resolution.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/data/image_folder.h"
#include "lockstep/io/image.h"

namespace lockstep::data {

struct BucketSize {
  int64_t width = 0;
  int64_t height = 0;
};

// The default table: square, 4:3, 3:4, 3:2, 2:3, 2:1 and 1:2 at about 256x256 pixels, every side a
// multiple of 32 (what a 6-level autoencoder needs).
std::vector<BucketSize> default_bucket_table();
// "256x256,288x224" -> sizes; throws InvalidArgument naming the bad entry.
std::vector<BucketSize> parse_bucket_table(const std::string& text);
// Throws InvalidArgument when the table is empty, a side is < 1 or not a multiple of `multiple`,
// or two buckets share an aspect ratio.
void check_bucket_table(const std::vector<BucketSize>& table, int64_t multiple);

// The bucket of `table` whose aspect ratio is nearest `width / height` on a log scale, among those
// `allowed` accepts (every one when it is empty); ties go to the earlier bucket; -1 when none is
// allowed. Images, and buckets too small to train alone, find their bucket this way.
int64_t nearest_bucket(const std::vector<BucketSize>& table, double width, double height,
                       const std::function<bool(size_t)>& allowed = {});

// Manifest entry indices per bucket (readable entries only; ties go to the earlier bucket).
std::vector<std::vector<int64_t>> assign_buckets(const Manifest& manifest, const std::vector<BucketSize>& table);

// Where fit_to_bucket takes its window (training augmentation; the default is the plain fit).
struct FitPlacement {
  double zoom = 1.0;        // >= 1: the image is scaled to cover the bucket zoom times over first
  double x = 0.5, y = 0.5;  // the window's position in the scaled image: 0 left/top .. 1 right/bottom
  bool flip = false;        // mirrored left to right
};

// Scales `image` so it covers width x height (times placement.zoom; area filter when shrinking),
// then crops the window placement puts there (the centre by default), mirrored when it says so.
io::Image fit_to_bucket(const io::Image& image, BucketSize size, const FitPlacement& placement = {});

}  // namespace lockstep::data
