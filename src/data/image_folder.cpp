#include "lockstep/data/image_folder.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/core/hash.h"
#include "lockstep/io/atomic_file.h"

#if LOCKSTEP_HAVE_OPENCV
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace lockstep::data {
namespace fs = std::filesystem;
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_THROW_IF_NOT(in, IoError, "cannot open image ", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

#if LOCKSTEP_HAVE_OPENCV
// Any decoded cv::Mat -> 8-bit `channels` (1 or 3, RGB order) interleaved.
io::Image to_image(cv::Mat m, int channels) {
  if (m.depth() == CV_16U)
    m.convertTo(m, CV_8U, 1.0 / 257.0);
  else if (m.depth() != CV_8U)
    m.convertTo(m, CV_8U);
  if (m.channels() == 4) {  // composite on black: rgb * alpha / 255
    std::vector<cv::Mat> planes;
    cv::split(m, planes);
    for (int c = 0; c < 3; ++c) cv::multiply(planes[c], planes[3], planes[c], 1.0 / 255.0);
    planes.pop_back();
    cv::merge(planes, m);
  }
  cv::Mat out;
  if (channels == 1) {
    if (m.channels() == 3)
      cv::cvtColor(m, out, cv::COLOR_BGR2GRAY);
    else
      out = m;
  } else {
    if (m.channels() == 1)
      cv::cvtColor(m, out, cv::COLOR_GRAY2RGB);
    else
      cv::cvtColor(m, out, cv::COLOR_BGR2RGB);
  }
  io::Image image;
  image.width = out.cols;
  image.height = out.rows;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(out.total()) * channels);
  const cv::Mat contiguous = out.isContinuous() ? out : out.clone();
  std::copy(contiguous.data, contiguous.data + image.pixels.size(), image.pixels.begin());
  return image;
}

#endif

// Why a JPEG or PNG is cut short, or "" when it is complete (or another format, or broken in a way
// the decoder judges). libjpeg decodes a truncated JPEG without an error, filling the rest with
// grey; libpng prints to stderr before it fails. Checking first makes both a clean, named error.
std::string truncation_error(const std::string& bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (n >= 2 && b[0] == 0xFF && b[1] == 0xD8) {
    // Walk the segments from SOI to EOI: marker FF xx, then a 2-byte length for most; a scan
    // (SOS) is followed by entropy-coded data, in which FF is always followed by 00 or a restart
    // marker, up to the next marker. Running out of bytes before EOI means the file was cut short.
    // Segments carry their lengths, so an EXIF thumbnail is skipped whole; bytes after EOI are not read.
    const std::string cut = detail::concat("truncated JPEG: no end-of-image marker (", n, " bytes)");
    auto is_restart = [](unsigned char m) { return m >= 0xD0 && m <= 0xD7; };
    size_t i = 2;
    while (true) {
      if (i >= n) return cut;
      if (b[i] != 0xFF) return "";        // not a marker where one must be: let the decoder judge
      while (i < n && b[i] == 0xFF) ++i;  // fill bytes
      if (i >= n) return cut;
      const unsigned char marker = b[i++];
      if (marker == 0xD9) return "";                       // EOI
      if (marker == 0x01 || is_restart(marker)) continue;  // no length
      if (i + 2 > n) return cut;
      i += (size_t{b[i]} << 8) | b[i + 1];
      if (marker == 0xDA) {
        while (i + 1 < n && !(b[i] == 0xFF && b[i + 1] != 0x00 && !is_restart(b[i + 1]))) ++i;
        if (i + 1 >= n) return cut;
      }
    }
  }
  static const unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::equal(kPng, kPng + 8, b)) {
    // Walk the chunks (4-byte length, 4-byte type, data, 4-byte CRC) up to IEND.
    size_t at = 8;
    while (at + 8 <= n) {
      const uint64_t length =
          (uint64_t{b[at]} << 24) | (uint64_t{b[at + 1]} << 16) | (uint64_t{b[at + 2]} << 8) | uint64_t{b[at + 3]};
      if (std::equal(b + at + 4, b + at + 8, reinterpret_cast<const unsigned char*>("IEND"))) return "";
      at += 12 + length;
    }
    return detail::concat("truncated PNG: its chunks run past the end of the file (", n, " bytes) before IEND");
  }
  return "";
}

#if LOCKSTEP_HAVE_OPENCV
// Decodes, or returns an empty Mat and says why in `error`.
cv::Mat decode_bytes(const std::string& bytes, std::string* error) {
  *error = truncation_error(bytes);
  if (!error->empty()) return cv::Mat();
  const cv::Mat raw(1, static_cast<int>(bytes.size()), CV_8UC1, const_cast<char*>(bytes.data()));
  cv::Mat decoded;
  try {
    decoded = cv::imdecode(raw, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception&) {
    // OpenCV throws for some broken files and returns an empty Mat for others.
  }
  if (decoded.empty()) *error = "cannot be decoded (corrupt, or a format this OpenCV lacks)";
  return decoded;
}
#endif

}  // namespace

std::string image_decoder_version() {
#if LOCKSTEP_HAVE_OPENCV
  return std::string("OpenCV ") + CV_VERSION;
#else
  return "";
#endif
}

bool is_image_file(const std::string& name) {
  std::string ext = fs::path(name).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::vector<std::string> known = {".png",  ".jpg", ".jpeg", ".webp", ".tif",
                                                 ".tiff", ".bmp", ".pgm",  ".ppm",  ".pnm"};
  return std::find(known.begin(), known.end(), ext) != known.end();
}

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
    const std::string bytes = read_bytes(full.string());
    e.checksum = fnv1a(bytes.data(), bytes.size());
    const cv::Mat decoded = decode_bytes(bytes, &e.error);
    if (!decoded.empty()) {
      e.width = decoded.cols;
      e.height = decoded.rows;
    }
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
    if (it->is_regular_file() && is_image_file(it->path().filename().string())) {
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

Manifest load_manifest(const std::string& path) {
  const std::string text = io::read_file(path);
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    Manifest m;
    m.root = j.at("root").get<std::string>();
    for (const auto& e : j.at("entries")) {
      ManifestEntry entry;
      entry.path = e.at("path").get<std::string>();
      entry.width = e.at("width").get<int64_t>();
      entry.height = e.at("height").get<int64_t>();
      entry.bytes = e.at("bytes").get<int64_t>();
      entry.mtime_ns = e.at("mtime_ns").get<int64_t>();
      entry.checksum = e.at("checksum").get<uint64_t>();
      entry.error = e.at("error").get<std::string>();
      m.entries.push_back(std::move(entry));
    }
    LOCKSTEP_THROW_IF_NOT(
        std::is_sorted(m.entries.begin(), m.entries.end(),
                       [](const ManifestEntry& a, const ManifestEntry& b) { return a.path < b.path; }),
        CorruptInput, path, ": manifest entries are not sorted by path");
    LOCKSTEP_THROW_IF_NOT(j.at("hash").get<uint64_t>() == m.hash(), CorruptInput, path,
                          ": manifest hash does not match its entries (edited or damaged)");
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw CorruptInput(detail::concat(path, ": not a lockstep manifest: ", e.what()));
  }
}

io::Image decode_image(const std::string& path, int channels) {
  LOCKSTEP_CHECK_ARG(channels == 1 || channels == 3, "decode_image: channels = ", channels, " must be 1 or 3");
#if !LOCKSTEP_HAVE_OPENCV
  throw InvalidArgument(detail::concat("cannot decode ", path, ": this build of lockstep has no OpenCV"));
#else
  std::string error;
  const cv::Mat decoded = decode_bytes(read_bytes(path), &error);
  LOCKSTEP_THROW_IF_NOT(!decoded.empty(), CorruptInput, "cannot decode image ", path, ": ", error);
  return to_image(decoded, channels);
#endif
}

}  // namespace lockstep::data
