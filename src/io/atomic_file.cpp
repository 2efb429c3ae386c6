#include "lockstep/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>

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
// `parent`: the directory, "" for the current one.
void sync_directory_of(const std::string& parent) {
  // Not `dir = "."` after the fact: GCC 12 warns about that assignment under C++20 (a false positive).
  const std::string dir = parent.empty() ? std::string(".") : parent;
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems cannot fsync a directory; the data itself is already safe then.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) fail("sync directory", dir, err);
}

void sync_directory(const std::string& path) { sync_directory_of(std::filesystem::path(path).parent_path().string()); }

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Throws IoError when `path` itself (not what it points to) is a symbolic link or anything but a
// regular file or absent: a link would redirect the write (a planted `R/.lock` -> ~/notes.txt), and
// the rename would turn /dev/null or a FIFO into a plain file.
void check_writable_name(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // absent: created
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const std::string to = std::filesystem::read_symlink(path, ec).string();
    throw IoError(detail::concat("cannot write '", path, "': it is a symbolic link", ec ? "" : " to '" + to + "'",
                                 "; lockstep does not write through links (remove the link, or name a regular file)"));
  }
  if (!S_ISREG(st.st_mode)) {
    throw IoError(detail::concat("cannot write '", path, "': it is ", kind_of(st.st_mode),
                                 "; lockstep writes regular files only (give the path of a new or regular file)"));
  }
}

// The temporary file beside `path`, written (not yet synced) and closed. The rename that follows
// replaces whatever then has the name, a link planted after the check included: it never writes
// through one.
void write_temporary(const std::string& path, const std::string& bytes, TempFile& tmp, bool sync) {
  LOCKSTEP_CHECK_ARG(!path.empty(), "write_file_atomic: empty path");
  check_writable_name(path);
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
  if (sync && ::fsync(tmp.fd) != 0) fail("sync", tmp.path, errno);
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) fail("close", tmp.path, errno);
}

void rename_temporary(const std::string& path, TempFile& tmp) {
  if (::rename(tmp.path.c_str(), path.c_str()) != 0) {
    int err = errno;
    throw IoError(detail::concat("cannot write '", path, "': rename from '", tmp.path, "' failed: ", errno_text(err)));
  }
  tmp.renamed = true;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  TempFile tmp;
  write_temporary(path, bytes, tmp, /*sync=*/true);
  rename_temporary(path, tmp);
  sync_directory(path);
}

void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files) {
  if (files.empty()) return;
  std::vector<TempFile> temporaries(files.size());
  for (size_t i = 0; i < files.size(); ++i) write_temporary(files[i].first, files[i].second, temporaries[i], false);
  // One flush of the filesystem holding them for all (fsync of each where syncfs is refused).
  int fd = ::open(temporaries.front().path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("open", temporaries.front().path, errno);
  const bool synced = ::syncfs(fd) == 0;
  ::close(fd);
  for (size_t i = 0; !synced && i < files.size(); ++i) {
    fd = ::open(temporaries[i].path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      fail("sync", temporaries[i].path, err);
    }
    ::close(fd);
  }
  std::set<std::string> directories;
  for (size_t i = 0; i < files.size(); ++i) {
    rename_temporary(files[i].first, temporaries[i]);
    directories.insert(std::filesystem::path(files[i].first).parent_path().string());
  }
  for (const std::string& directory : directories) sync_directory_of(directory);
}

std::string read_file(const std::string& path) {
  // Checked before opening: opening a FIFO blocks until someone writes, and /dev/zero never ends.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("open", path, errno);
  if (!S_ISREG(st.st_mode)) {
    throw IoError(detail::concat("cannot read '", path, "': it is ", kind_of(st.st_mode), ", not a regular file"));
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("open", path, errno);
  std::string out;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // replaced between stat and open
    ::close(fd);
    throw IoError(detail::concat("cannot read '", path, "': it is not a regular file"));
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
