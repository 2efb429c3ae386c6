// Datasets that are a directory tree of image files: a manifest of every image (path,
// size, checksum) built once and cached, and decoding to the model's channel count. Decoding goes
// through OpenCV (JPEG, PNG with palette, alpha or 16 bits, grayscale, WebP, TIFF, BMP, PNM).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/io/image.h"

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

// "OpenCV 4.6.0" when this build decodes images, "" when it was built without OpenCV.
std::string image_decoder_version();

// True for the file names this loader reads (by extension, any case).
bool is_image_file(const std::string& name);

// Walks `root` recursively. Every image file is decoded once to learn its size; a corrupt,
// truncated or unreadable file stays in the manifest with its error (the data plan replaces it,
// it is never silently dropped on one rank). Entries of `cached` whose path, size and mtime match
// are reused without decoding. Files are decoded on `threads` threads (0: one per core).
// `progress` (optional) is called on the caller's thread with (files done, files in all). Throws
// IoError when `root` is not a readable directory.
using ScanProgress = std::function<void(int64_t done, int64_t total)>;
Manifest scan_image_folder(const std::string& root, const Manifest* cached = nullptr, const ScanProgress& progress = {},
                           int threads = 0);

// The `count` readable entries whose paths hash lowest, sorted: a held-out evaluation set that
// depends on the paths alone, so it stays put when other files come or go. Throws InvalidArgument
// when it would leave no readable entry to train on.
std::vector<int64_t> held_out_entries(const Manifest& manifest, int64_t count);

// What changed from `before` to `after` ("2 added (x.png, y.png), 1 modified (z.jpg)"), naming a
// few paths of each kind; "" when the two list the same files with the same contents.
std::string describe_changes(const Manifest& before, const Manifest& after);

// JSON, written atomically. load_manifest throws CorruptInput naming the file when malformed.
void save_manifest(const std::string& path, const Manifest& manifest);
Manifest load_manifest(const std::string& path);

// Decodes to 8-bit `channels` (1 or 3): 16-bit samples scaled down, alpha composited on black (as
// io::load_png), gray replicated, colour to luma for 1 channel. Throws CorruptInput naming the file
// when it cannot be decoded, IoError when it cannot be read.
io::Image decode_image(const std::string& path, int channels);

}  // namespace lockstep::data
