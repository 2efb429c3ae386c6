// Writing files so that a crash never leaves a partial file under the final name.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace lockstep::io {

// Writes `bytes` to a temporary file beside `path`, flushes it to disk, then renames it over
// `path` (and syncs the directory). Throws IoError naming the path on any failure and removes the
// temporary file; an existing file at `path` is untouched unless the whole write succeeded. A
// symbolic link, directory, device, FIFO or socket at `path` is refused with IoError, never
// replaced or written through (a link planted in a run directory must not redirect a write).
void write_file_atomic(const std::string& path, const std::string& bytes);

// Many files at once, each as write_file_atomic writes one (no partial file under a final name, no
// link written through), for one flush of the filesystem instead of one per file: every temporary
// file is written, then the filesystem is synced once (syncfs), then each is renamed and each
// directory synced once. `files`: (path, bytes); the paths must differ. On an error, the files
// renamed so far stay, the rest are removed, and IoError names the path.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files);

// Reads a whole regular file. Throws IoError naming the path when it cannot be opened or read, or
// is not a regular file (a FIFO or device is refused before it is opened, so it cannot block).
std::string read_file(const std::string& path);

}  // namespace lockstep::io
