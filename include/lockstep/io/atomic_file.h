// Writing files so that a crash never leaves a partial file under the final name.
#pragma once

#include <string>

namespace lockstep::io {

// Writes `bytes` to a temporary file beside `path`, flushes it to disk, then renames it over
// `path` (and syncs the directory). Throws IoError naming the path on any failure and removes the
// temporary file; an existing file at `path` is untouched unless the whole write succeeded. A
// symbolic link, directory, device, FIFO or socket at `path` is refused with IoError, never
// replaced or written through (a link planted in a run directory must not redirect a write).
void write_file_atomic(const std::string& path, const std::string& bytes);

// Reads a whole regular file. Throws IoError naming the path when it cannot be opened or read, or
// is not a regular file (a FIFO or device is refused before it is opened, so it cannot block).
std::string read_file(const std::string& path);

}  // namespace lockstep::io
