#include "lockstep/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "lockstep/core/error.h"

namespace lockstep::io {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw IoError(detail::concat("cannot ", what, " '", path, "': ", errno_text(err)));
}

// Closes the descriptor on every path out of write_file_atomic, and removes the temporary file
// unless the rename has already happened.
struct TempFile {
  std::string path;
  int fd = -1;
  bool renamed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!renamed) ::unlink(path.c_str());
  }
};

void write_all(int fd, const std::string& bytes, const std::string& tmp) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", tmp, errno);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

// After a rename the directory entry itself must reach the disk, or a crash can lose the file.
void sync_directory(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems cannot fsync a directory; the data itself is already safe then.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) fail("sync directory", dir, err);
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  LOCKSTEP_CHECK_ARG(!path.empty(), "write_file_atomic: empty path");
  TempFile tmp;
  // pid + counter: ranks run as threads in one process may write beside each other at once.
  static std::atomic<uint64_t> counter{0};
  tmp.path = detail::concat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (tmp.fd < 0) {
    int err = errno;
    tmp.renamed = true;  // nothing was created, so there is nothing to remove
    throw IoError(
        detail::concat("cannot write '", path, "': cannot create temporary file '", tmp.path, "': ", errno_text(err)));
  }
  write_all(tmp.fd, bytes, tmp.path);
  if (::fsync(tmp.fd) != 0) fail("sync", tmp.path, errno);
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) fail("close", tmp.path, errno);
  if (::rename(tmp.path.c_str(), path.c_str()) != 0) {
    int err = errno;
    throw IoError(detail::concat("cannot write '", path, "': rename from '", tmp.path, "' failed: ", errno_text(err)));
  }
  tmp.renamed = true;
  sync_directory(path);
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("open", path, errno);
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw IoError(detail::concat("cannot read '", path, "': it is a directory"));
  }
  if (st.st_size > 0) out.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      fail("read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace lockstep::io
