// Resolution / aspect-ratio buckets: every readable image of a manifest goes to the
// bucket whose aspect ratio is nearest its own, and is resized to cover the bucket's size and
// centre-cropped to it, so one global batch is one resolution.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/data/bucket_table.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/io/image.h"

namespace lockstep::data {

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
