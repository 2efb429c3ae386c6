#include "lockstep/data/buckets.h"

#include <cmath>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"

#if LOCKSTEP_HAVE_OPENCV
#include <opencv2/imgproc.hpp>
#endif

namespace lockstep::data {

std::vector<std::vector<int64_t>> assign_buckets(const Manifest& manifest, const std::vector<BucketSize>& table) {
  LOCKSTEP_CHECK_ARG(!table.empty(), "the bucket table is empty");
  std::vector<std::vector<int64_t>> out(table.size());
  for (size_t i = 0; i < manifest.entries.size(); ++i) {
    const auto& e = manifest.entries[i];
    if (!e.readable()) continue;
    const int64_t b = nearest_bucket(table, static_cast<double>(e.width), static_cast<double>(e.height));
    out[static_cast<size_t>(b)].push_back(static_cast<int64_t>(i));
  }
  return out;
}

io::Image fit_to_bucket(const io::Image& image, BucketSize size, const FitPlacement& placement) {
  LOCKSTEP_CHECK_ARG(image.width >= 1 && image.height >= 1 && size.width >= 1 && size.height >= 1,
                     "fit_to_bucket: cannot fit a ", image.width, "x", image.height, " image to ", size.width, "x",
                     size.height);
  LOCKSTEP_CHECK_ARG(placement.zoom >= 1 && placement.zoom <= 16 && placement.x >= 0 && placement.x <= 1 &&
                         placement.y >= 0 && placement.y <= 1,
                     "fit_to_bucket: zoom ", placement.zoom, " must lie in [1, 16] and the window position (",
                     placement.x, ", ", placement.y, ") in [0, 1]");
#if !LOCKSTEP_HAVE_OPENCV
  throw InvalidArgument("fit_to_bucket: this build of lockstep has no OpenCV");
#else
  const double scale = placement.zoom * std::max(static_cast<double>(size.width) / image.width,
                                                 static_cast<double>(size.height) / image.height);
  const int w = std::max<int>(static_cast<int>(size.width), static_cast<int>(std::lround(image.width * scale)));
  const int h = std::max<int>(static_cast<int>(size.height), static_cast<int>(std::lround(image.height * scale)));
  const cv::Mat src(image.height, image.width, CV_8UC(image.channels), const_cast<uint8_t*>(image.pixels.data()));
  cv::Mat scaled;
  cv::resize(src, scaled, cv::Size(w, h), 0, 0, scale < 1 ? cv::INTER_AREA : cv::INTER_LINEAR);
  // The centre by default, as integer division places it.
  const auto offset = [](int spare, double at) {
    return at == 0.5 ? spare / 2 : static_cast<int>(std::lround(at * spare));
  };
  const cv::Rect window(offset(w - static_cast<int>(size.width), placement.x),
                        offset(h - static_cast<int>(size.height), placement.y), static_cast<int>(size.width),
                        static_cast<int>(size.height));
  cv::Mat cropped = scaled(window).clone();
  if (placement.flip) cv::flip(cropped, cropped, 1);
  io::Image out;
  out.width = static_cast<int>(size.width);
  out.height = static_cast<int>(size.height);
  out.channels = image.channels;
  out.pixels.assign(cropped.data, cropped.data + cropped.total() * image.channels);
  return out;
#endif
}

}  // namespace lockstep::data
