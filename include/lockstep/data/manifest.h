// The manifest of an image folder: every image file's path, size, checksum and dimensions (or why
// it cannot be decoded), what ranks compare before training and what a resumed run checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data {

struct ManifestEntry {
  std::string path;   // relative to the manifest's root, '/'-separated
  int64_t width = 0;  // 0 when unreadable
  int64_t height = 0;
  int64_t bytes = 0;      // file size
  int64_t mtime_ns = 0;   // modification time, to reuse a cached entry
  uint64_t checksum = 0;  // of the file's bytes
  std::string error;      // why it could not be decoded; empty when readable
  bool readable() const { return error.empty(); }
};

struct Manifest {
  std::string root;
  std::vector<ManifestEntry> entries;  // sorted by path

  // Of every entry's (path, size, checksum, dimensions): what ranks compare before training.
  uint64_t hash() const;
  int64_t readable_count() const;
};

// What changed from `before` to `after` ("2 added (x.png, y.png), 1 modified (z.jpg)"), naming a
// few paths of each kind; "" when the two list the same files with the same contents.
std::string describe_changes(const Manifest& before, const Manifest& after);

// JSON, written atomically. load_manifest throws CorruptInput naming the file when malformed.
void save_manifest(const std::string& path, const Manifest& manifest);
Manifest load_manifest(const std::string& path);
// The text of a manifest file; `origin` names it in errors.
Manifest parse_manifest(const std::string& text, const std::string& origin);

}  // namespace lockstep::data
