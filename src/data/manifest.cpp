#include "lockstep/data/manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>
#include <set>

#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/io/nesting.h"

namespace lockstep::data {

uint64_t Manifest::hash() const {
  uint64_t h = kFnv1aOffset;
  for (const auto& e : entries) {
    h = fnv1a(e.path.data(), e.path.size() + 1, h);
    for (int64_t v : {e.width, e.height, e.bytes}) h = fnv1a_int64(v, h);
    h = fnv1a_int64(static_cast<int64_t>(e.checksum), h);
  }
  return h;
}

int64_t Manifest::readable_count() const {
  return std::count_if(entries.begin(), entries.end(), [](const ManifestEntry& e) { return e.readable(); });
}

std::string describe_changes(const Manifest& before, const Manifest& after) {
  std::vector<std::string> added, removed, modified;
  auto a = before.entries.begin(), b = after.entries.begin();
  while (a != before.entries.end() || b != after.entries.end()) {
    if (b == after.entries.end() || (a != before.entries.end() && a->path < b->path)) {
      removed.push_back((a++)->path);
    } else if (a == before.entries.end() || b->path < a->path) {
      added.push_back((b++)->path);
    } else {
      // Errors are compared as readable or not: their text may name the folder's absolute path.
      if (a->bytes != b->bytes || a->checksum != b->checksum || a->width != b->width || a->height != b->height ||
          a->readable() != b->readable()) {
        modified.push_back(a->path);
      }
      ++a;
      ++b;
    }
  }
  std::string out;
  auto describe = [&out](const std::vector<std::string>& paths, const char* what) {
    if (paths.empty()) return;
    constexpr size_t kNamed = 3;
    if (!out.empty()) out += ", ";
    out += detail::concat(paths.size(), " ", what, " (");
    for (size_t i = 0; i < std::min(paths.size(), kNamed); ++i) out += (i ? ", " : "") + paths[i];
    out += paths.size() > kNamed ? ", ...)" : ")";
  };
  describe(added, "added");
  describe(removed, "removed");
  describe(modified, "modified");
  return out;
}

void save_manifest(const std::string& path, const Manifest& manifest) {
  nlohmann::json j;
  j["root"] = manifest.root;
  j["hash"] = manifest.hash();
  j["entries"] = nlohmann::json::array();
  for (const auto& e : manifest.entries) {
    j["entries"].push_back({{"path", e.path},
                            {"width", e.width},
                            {"height", e.height},
                            {"bytes", e.bytes},
                            {"mtime_ns", e.mtime_ns},
                            {"checksum", e.checksum},
                            {"error", e.error}});
  }
  io::write_file_atomic(path, j.dump(1) + "\n");
}

Manifest load_manifest(const std::string& path) { return parse_manifest(io::read_file(path), path); }

Manifest parse_manifest(const std::string& text, const std::string& path) {
  io::check_nesting(io::json_nesting_depth(text), io::kMaxJsonNesting, path);
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    Manifest m;
    m.root = j.at("root").get<std::string>();
    for (const auto& e : j.at("entries")) {
      ManifestEntry entry;
      entry.path = e.at("path").get<std::string>();
      entry.width = e.at("width").get<int64_t>();
      entry.height = e.at("height").get<int64_t>();
      entry.bytes = e.at("bytes").get<int64_t>();
      entry.mtime_ns = e.at("mtime_ns").get<int64_t>();
      entry.checksum = e.at("checksum").get<uint64_t>();
      entry.error = e.at("error").get<std::string>();
      m.entries.push_back(std::move(entry));
    }
    LOCKSTEP_THROW_IF_NOT(
        std::is_sorted(m.entries.begin(), m.entries.end(),
                       [](const ManifestEntry& a, const ManifestEntry& b) { return a.path < b.path; }),
        CorruptInput, path, ": manifest entries are not sorted by path");
    LOCKSTEP_THROW_IF_NOT(j.at("hash").get<uint64_t>() == m.hash(), CorruptInput, path,
                          ": manifest hash does not match its entries (edited or damaged)");
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw CorruptInput(detail::concat(path, ": not a lockstep manifest: ", e.what()));
  }
}

}  // namespace lockstep::data
