#include "lockstep/data/image_folder.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/core/utf8.h"
#include "lockstep/io/image_decode.h"

namespace lockstep::data {
namespace fs = std::filesystem;

#if LOCKSTEP_HAVE_OPENCV
namespace {

ManifestEntry unusable(std::string path, std::string error) {
  ManifestEntry e;
  e.path = std::move(path);
  e.error = std::move(error);
  return e;
}

// What a folder holds: its image files' paths relative to the root, and an unreadable entry for
// each thing that cannot be listed or named (the run must see them, not lose them silently).
struct Listing {
  std::vector<std::string> files;
  std::vector<ManifestEntry> unusable;
};

// Walks the tree below `root` without following links to directories (as find does by default).
Listing list_folder(const std::string& root) {
  Listing out;
  std::vector<fs::path> pending{fs::path(root)};
  while (!pending.empty()) {
    const fs::path dir = pending.back();
    pending.pop_back();
    const std::string dir_rel = dir.lexically_relative(root).generic_string();
    const std::string dir_shown = dir_rel == "." ? std::string("./") : dir_rel + "/";
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec) {
      out.unusable.push_back(unusable(
          dir_shown, detail::concat("cannot list this directory (", ec.message(), "): its images are not used")));
      continue;
    }
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) break;
      // Lexically: a symbolic link keeps its own name (fs::relative would give its target's path).
      const std::string rel = it->path().lexically_relative(root).generic_string();
      const bool image = io::is_image_file(it->path().filename().string());
      std::error_code kind_ec;
      const fs::file_status own = it->symlink_status(kind_ec);
      const bool directory = !kind_ec && fs::is_directory(own);
      if (!image && !directory) continue;
      if (!is_utf8(rel)) {
        out.unusable.push_back(
            unusable(escape_bytes(rel) + (directory ? "/" : ""), "its name is not valid UTF-8: rename it to be used"));
        continue;
      }
      if (directory) {
        pending.push_back(it->path());
        continue;
      }
      const fs::file_status target = it->status(kind_ec);  // follows a link: ELOOP, ENOENT
      if (kind_ec) {
        out.unusable.push_back(unusable(rel, detail::concat("cannot be read (", kind_ec.message(), ")")));
      } else if (fs::is_regular_file(target)) {
        out.files.push_back(rel);
      } else if (!fs::is_directory(target)) {
        out.unusable.push_back(unusable(rel, "is not a regular file (a device, FIFO or socket)"));
      }
    }
    if (ec) {
      out.unusable.push_back(
          unusable(dir_shown, detail::concat("listing this directory failed part-way (", ec.message(), ")")));
    }
  }
  std::sort(out.files.begin(), out.files.end());
  return out;
}

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
  Listing listing = list_folder(root);
  const std::vector<std::string>& files = listing.files;
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
  // What could not be listed or named joins the files, in path order (a name may repeat only
  // if an escaped non-UTF-8 name equals a real one: the real file is kept).
  m.entries.insert(m.entries.end(), listing.unusable.begin(), listing.unusable.end());
  std::stable_sort(m.entries.begin(), m.entries.end(),
                   [](const ManifestEntry& a, const ManifestEntry& b) { return a.path < b.path; });
  m.entries.erase(std::unique(m.entries.begin(), m.entries.end(),
                              [](const ManifestEntry& a, const ManifestEntry& b) { return a.path == b.path; }),
                  m.entries.end());
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
