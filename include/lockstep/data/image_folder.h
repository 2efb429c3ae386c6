// Datasets that are a directory tree of image files: scanning the tree into a manifest of every
// image (data/manifest.h), each decoded once (io/image_decode.h) to learn its size, and the
// held-out evaluation set.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/data/manifest.h"

namespace lockstep::data {

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

}  // namespace lockstep::data
