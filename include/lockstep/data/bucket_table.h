// The bucket table of image folders: bucket sizes, parsed and checked, and the bucket nearest an
// aspect ratio. No image code: the Python package's bucket sampler uses it alone.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

}  // namespace lockstep::data
