#include "lockstep/data/manifest.h"
#include "lockstep/io/json_error.h"

#include <nlohmann/json.hpp>

#include <cstdint>

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

namespace {

// A whole number of JSON: nlohmann converts a float such as 1.7e27 to int64_t by a cast whose
// result is undefined when out of range, so the kind is checked first.
int64_t whole_number(const nlohmann::json& e, const char* key, const std::string& path) {
  const nlohmann::json& v = e.at(key);
  LOCKSTEP_THROW_IF_NOT(v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= INT64_MAX),
                        CorruptInput, path, ": manifest field '", key, "' is ", v.type_name(), " ",
                        v.dump().substr(0, 40), ", not a 64-bit integer");
  return v.get<int64_t>();
}

uint64_t checksum(const nlohmann::json& e, const char* key, const std::string& path) {
  const nlohmann::json& v = e.at(key);
  LOCKSTEP_THROW_IF_NOT(v.is_number_unsigned(), CorruptInput, path, ": manifest field '", key, "' is ", v.type_name(),
                        " ", v.dump().substr(0, 40), ", not an unsigned 64-bit integer");
  return v.get<uint64_t>();
}

}  // namespace

Manifest parse_manifest(const std::string& text, const std::string& path) {
  io::check_nesting(io::json_nesting_depth(text), io::kMaxJsonNesting, path);
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    Manifest m;
    m.root = j.at("root").get<std::string>();
    for (const auto& e : j.at("entries")) {
      ManifestEntry entry;
      entry.path = e.at("path").get<std::string>();
      entry.width = whole_number(e, "width", path);
      entry.height = whole_number(e, "height", path);
      entry.bytes = whole_number(e, "bytes", path);
      entry.mtime_ns = whole_number(e, "mtime_ns", path);
      entry.checksum = checksum(e, "checksum", path);
      entry.error = e.at("error").get<std::string>();
      const bool sized = entry.width > 0 && entry.height > 0;
      LOCKSTEP_THROW_IF_NOT(entry.width >= 0 && entry.height >= 0 && entry.bytes >= 0 && (sized || !entry.readable()),
                            CorruptInput, path, ": manifest entry '", entry.path.substr(0, 200), "' has size ",
                            entry.width, "x", entry.height, " and ", entry.bytes, " bytes");
      m.entries.push_back(std::move(entry));
    }
    LOCKSTEP_THROW_IF_NOT(std::adjacent_find(m.entries.begin(), m.entries.end(),
                                             [](const ManifestEntry& a, const ManifestEntry& b) {
                                               return a.path >= b.path;
                                             }) == m.entries.end(),
                          CorruptInput, path, ": manifest entries are not sorted by path, each once");
    LOCKSTEP_THROW_IF_NOT(checksum(j, "hash", path) == m.hash(), CorruptInput, path,
                          ": manifest hash does not match its entries (edited or damaged)");
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw CorruptInput(detail::concat(path, ": not a lockstep manifest: ", io::json_error_text(e)));
  }
}

}  // namespace lockstep::data
