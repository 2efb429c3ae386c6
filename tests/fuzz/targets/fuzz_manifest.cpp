// Image-folder manifests (RUN/manifest.json, reused by the next scan): any text parses or throws
// CorruptInput, and a manifest that parses has its entries sorted and its hash checked.
#include "fuzz_check.h"
#include "lockstep/data/manifest.h"

#include <algorithm>

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parsed = fuzz::unless_refused([&] { return data::parse_manifest(fuzz::input(data, size), "fuzz input"); });
  if (!parsed) return 0;
  const auto& manifest = *parsed;
  fuzz::require(
      std::is_sorted(manifest.entries.begin(), manifest.entries.end(),
                     [](const data::ManifestEntry& a, const data::ManifestEntry& b) { return a.path < b.path; }),
      "a parsed manifest's entries are sorted by path");
  fuzz::require(manifest.readable_count() <= static_cast<int64_t>(manifest.entries.size()),
                "no more readable entries than entries");
  return 0;
}
