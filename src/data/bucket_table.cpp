#include "lockstep/data/bucket_table.h"

#include <cmath>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::data {

std::vector<BucketSize> default_bucket_table() {
  return {{256, 256}, {288, 224}, {224, 288}, {320, 224}, {224, 320}, {384, 192}, {192, 384}};
}

std::vector<BucketSize> parse_bucket_table(const std::string& text) {
  std::vector<BucketSize> table;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t x = item.find('x');
    BucketSize s;
    try {
      size_t used_w = 0, used_h = 0;
      LOCKSTEP_THROW_IF_NOT(x != std::string::npos, InvalidArgument, "");
      s.width = std::stoll(item.substr(0, x), &used_w);
      s.height = std::stoll(item.substr(x + 1), &used_h);
      LOCKSTEP_THROW_IF_NOT(used_w == x && used_h == item.size() - x - 1, InvalidArgument, "");
    } catch (const std::exception&) {
      throw InvalidArgument(detail::concat("bucket table entry '", item, "' is not WIDTHxHEIGHT (e.g. 256x256)"));
    }
    table.push_back(s);
  }
  return table;
}

void check_bucket_table(const std::vector<BucketSize>& table, int64_t multiple) {
  LOCKSTEP_CHECK_ARG(!table.empty(), "the bucket table is empty");
  for (size_t i = 0; i < table.size(); ++i) {
    const auto& s = table[i];
    LOCKSTEP_CHECK_ARG(s.width >= 1 && s.height >= 1 && s.width % multiple == 0 && s.height % multiple == 0, "bucket ",
                       i, " (", s.width, "x", s.height, "): each side must be ",
                       multiple > 1 ? detail::concat("a positive multiple of ", multiple, " for this model")
                                    : std::string("positive"));
    for (size_t j = 0; j < i; ++j) {
      LOCKSTEP_CHECK_ARG(s.width * table[j].height != s.height * table[j].width, "buckets ", j, " (", table[j].width,
                         "x", table[j].height, ") and ", i, " (", s.width, "x", s.height,
                         ") have the same aspect ratio");
    }
  }
}

int64_t nearest_bucket(const std::vector<BucketSize>& table, double width, double height,
                       const std::function<bool(size_t)>& allowed) {
  const double aspect = std::log(width / height);
  int64_t best = -1;
  double best_distance = 1e300;
  for (size_t b = 0; b < table.size(); ++b) {
    if (allowed && !allowed(b)) continue;
    const double d =
        std::abs(aspect - std::log(static_cast<double>(table[b].width) / static_cast<double>(table[b].height)));
    if (d < best_distance - 1e-12) {
      best = static_cast<int64_t>(b);
      best_distance = d;
    }
  }
  return best;
}

}  // namespace lockstep::data
