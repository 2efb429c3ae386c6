#include "lockstep/data/image_folder.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/io/image_decode.h"

namespace lockstep::data {
namespace fs = std::filesystem;

#if LOCKSTEP_HAVE_OPENCV
namespace {
// One file's entry: reused from `cached` when its size and time match, else read and decoded.
ManifestEntry scan_entry(const std::string& root, const std::string& rel, const Manifest* cached) {
  const fs::path full = fs::path(root) / rel;
  ManifestEntry e;
  e.path = rel;
  std::error_code ec;
  e.bytes = static_cast<int64_t>(fs::file_size(full, ec));
  e.mtime_ns = static_cast<int64_t>(fs::last_write_time(full, ec).time_since_epoch().count());
  if (cached) {
    const auto hit = std::lower_bound(cached->entries.begin(), cached->entries.end(), rel,
                                      [](const ManifestEntry& c, const std::string& p) { return c.path < p; });
    if (hit != cached->entries.end() && hit->path == rel && hit->bytes == e.bytes && hit->mtime_ns == e.mtime_ns) {
      return *hit;
    }
  }
  try {
    const std::string bytes = io::read_image_bytes(full.string());
    e.checksum = fnv1a(bytes.data(), bytes.size());
    const io::ImageProbe probe = io::probe_image(bytes);
    e.width = probe.width;
    e.height = probe.height;
    e.error = probe.error;
  } catch (const Error& err) {
    e.error = err.what();
  }
  return e;
}
}  // namespace
#endif

Manifest scan_image_folder(const std::string& root, const Manifest* cached, const ScanProgress& progress, int threads) {
  LOCKSTEP_THROW_IF_NOT(fs::is_directory(root), IoError, "image folder ", root, " is not a directory");
#if !LOCKSTEP_HAVE_OPENCV
  throw InvalidArgument(detail::concat("image folder ", root, ": this build of lockstep has no OpenCV to decode ",
                                       "images (install the packages scripts/install-deps lists and rebuild)"));
#else
  Manifest m;
  m.root = root;
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied);
       it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file() && io::is_image_file(it->path().filename().string())) {
      // Lexically: a symbolic link keeps its own name (fs::relative would give its target's path).
      files.push_back(it->path().lexically_relative(root).generic_string());
    }
  }
  std::sort(files.begin(), files.end());
  const auto total = static_cast<int64_t>(files.size());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(total, 1)));

  // Files are handed out one at a time; each lands in its own slot, so the order stays sorted.
  m.entries.resize(files.size());
  std::atomic<size_t> next{0};
  std::atomic<int64_t> done{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&](bool reports) {
    try {
      for (size_t i; (i = next++) < files.size();) {
        m.entries[i] = scan_entry(root, files[i], cached);
        const int64_t d = ++done;
        if (reports && progress) progress(d, total);  // the caller's thread alone reports
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = files.size();  // the others stop too
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work, false);
  work(true);
  for (auto& h : helpers) h.join();
  if (error) std::rethrow_exception(error);
  if (progress) progress(total, total);
  return m;
#endif
}

std::vector<int64_t> held_out_entries(const Manifest& manifest, int64_t count) {
  const int64_t readable = manifest.readable_count();
  LOCKSTEP_CHECK_ARG(count >= 0 && count < readable, "image folder ", manifest.root, ": cannot hold out ", count,
                     " images for evaluation from ", readable, " readable ones (some must remain to train on)");
  std::vector<std::pair<uint64_t, int64_t>> keyed;
  for (size_t i = 0; i < manifest.entries.size(); ++i) {
    const auto& e = manifest.entries[i];
    if (e.readable()) keyed.emplace_back(fnv1a(e.path.data(), e.path.size()), static_cast<int64_t>(i));
  }
  std::partial_sort(keyed.begin(), keyed.begin() + count, keyed.end());
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(keyed[static_cast<size_t>(i)].second);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace lockstep::data
