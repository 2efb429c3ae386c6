// Image folders: the manifest (every file, sorted, sizes, checksums, errors kept), its cache, and
// decoding of the formats and pixel layouts a real folder holds. Images are written here with
// OpenCV; none are committed.
#include "lockstep/data/image_folder.h"
#include "lockstep/io/image_decode.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "io/test_temp_dir.h"
#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/io/image_header.h"

#if LOCKSTEP_HAVE_OPENCV
#include <opencv2/imgcodecs.hpp>

namespace lockstep::data {
namespace {
namespace fs = std::filesystem;

void write(const std::string& path, const cv::Mat& m) {
  fs::create_directories(fs::path(path).parent_path());
  ASSERT_TRUE(cv::imwrite(path, m)) << path;
}

// A PNG with a palette (colour type 3, which OpenCV cannot write): `indices` is width x height,
// `alpha` the palette entries' opacities (a tRNS chunk), empty for opaque.
void write_palette_png(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb_palette,
                       const std::vector<uint8_t>& alpha, const std::vector<uint8_t>& indices) {
  std::string out = "\x89PNG\r\n\x1a\n";
  auto chunk = [&out](const char* type, const std::string& data) {
    auto be32 = [&out](uint32_t v) {
      for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xff);
    };
    be32(static_cast<uint32_t>(data.size()));
    const std::string body = std::string(type) + data;
    out += body;
    be32(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
  };
  std::string ihdr;
  for (int v : {width, height}) {
    for (int s = 24; s >= 0; s -= 8) ihdr += static_cast<char>((v >> s) & 0xff);
  }
  ihdr += std::string("\x08\x03\x00\x00\x00", 5);  // 8 bits, palette, deflate, no filter, no interlace
  chunk("IHDR", ihdr);
  chunk("PLTE", std::string(rgb_palette.begin(), rgb_palette.end()));
  if (!alpha.empty()) chunk("tRNS", std::string(alpha.begin(), alpha.end()));
  std::string raw;
  for (int y = 0; y < height; ++y) {
    raw += '\0';  // filter: none
    raw.append(indices.begin() + y * width, indices.begin() + (y + 1) * width);
  }
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(size, '\0');
  compress(reinterpret_cast<Bytef*>(packed.data()), &size, reinterpret_cast<const Bytef*>(raw.data()),
           static_cast<uLong>(raw.size()));
  packed.resize(size);
  chunk("IDAT", packed);
  chunk("IEND", "");
  std::ofstream(path, std::ios::binary) << out;
}

// A colour image of random pixels, encoded as `extension` (".jpg", ".png") by OpenCV; "" if it cannot.
std::string encoded_noise(const std::string& extension, int rows, int cols) {
  cv::Mat photo(rows, cols, CV_8UC3);
  cv::randu(photo, cv::Scalar::all(0), cv::Scalar::all(255));
  std::vector<uchar> encoded;
  if (!cv::imencode(extension, photo, encoded)) return "";
  return std::string(encoded.begin(), encoded.end());
}

// A small tree of every kind of file a folder may hold.
std::string make_tree(const test_util::TempDir& tmp) {
  const std::string root = tmp.file("images");
  write(root + "/a.png", cv::Mat(30, 40, CV_8UC3, cv::Scalar(10, 20, 30)));  // BGR
  write(root + "/sub/b.jpg", cv::Mat(16, 24, CV_8UC1, cv::Scalar(128)));     // gray JPEG
  write(root + "/sub/deeper/c.webp", cv::Mat(20, 10, CV_8UC3, cv::Scalar(0, 255, 0)));
  write(root + "/d.tif", cv::Mat(8, 12, CV_16UC1, cv::Scalar(65535)));          // 16-bit TIFF
  write(root + "/e.png", cv::Mat(5, 6, CV_8UC4, cv::Scalar(200, 100, 50, 0)));  // fully transparent
  std::ofstream(root + "/notes.txt") << "not an image";
  // A PNG cut short, and an empty "JPEG".
  std::ifstream in(root + "/a.png", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(root + "/broken.png", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  std::ofstream(root + "/sub/empty.JPG", std::ios::binary);
  return root;
}

TEST(ImageFolder, TheManifestListsEveryImageSortedWithSizesAndKeepsTheBrokenOnes) {
  test_util::TempDir tmp;
  const Manifest m = scan_image_folder(make_tree(tmp));
  std::vector<std::string> paths;
  for (const auto& e : m.entries) paths.push_back(e.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"a.png", "broken.png", "d.tif", "e.png", "sub/b.jpg", "sub/deeper/c.webp",
                                             "sub/empty.JPG"}));
  auto entry = [&](const std::string& p) {
    return *std::find_if(m.entries.begin(), m.entries.end(), [&](const ManifestEntry& e) { return e.path == p; });
  };
  EXPECT_EQ(entry("a.png").width, 40);
  EXPECT_EQ(entry("a.png").height, 30);
  EXPECT_EQ(entry("sub/deeper/c.webp").width, 10);
  EXPECT_EQ(entry("d.tif").height, 8);
  EXPECT_TRUE(entry("a.png").readable());
  EXPECT_FALSE(entry("broken.png").readable());
  EXPECT_FALSE(entry("sub/empty.JPG").readable());
  EXPECT_EQ(m.readable_count(), 5);
  EXPECT_GT(entry("a.png").bytes, 0);
  EXPECT_NE(entry("a.png").checksum, entry("e.png").checksum);
}

TEST(ImageFolder, TheCacheIsReusedUntilAFileChangesAndTheHashFollowsTheFiles) {
  test_util::TempDir tmp;
  const std::string root = make_tree(tmp);
  const Manifest first = scan_image_folder(root);
  save_manifest(tmp.file("manifest.json"), first);
  const Manifest loaded = load_manifest(tmp.file("manifest.json"));
  EXPECT_EQ(loaded.hash(), first.hash());
  EXPECT_EQ(scan_image_folder(root, &loaded).hash(), first.hash());
  write(root + "/a.png", cv::Mat(31, 40, CV_8UC3, cv::Scalar(1, 2, 3)));  // other size and bytes
  const Manifest again = scan_image_folder(root, &loaded);
  EXPECT_NE(again.hash(), first.hash());
  EXPECT_EQ(again.entries[0].height, 31);
}

TEST(ImageFolder, ADamagedManifestIsACorruptInputNamingTheFile) {
  test_util::TempDir tmp;
  const Manifest m = scan_image_folder(make_tree(tmp));
  save_manifest(tmp.file("m.json"), m);
  std::string text;
  {
    std::ifstream in(tmp.file("m.json"));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = text.find("\"width\": 40");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 11, "\"width\": 41");
  std::ofstream(tmp.file("m.json")) << text;
  try {
    load_manifest(tmp.file("m.json"));
    FAIL() << "accepted an edited manifest";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("m.json: manifest hash does not match"), std::string::npos) << e.what();
  }
  // A float where an integer belongs (found by tests/fuzz: the JSON library's cast was undefined).
  std::string huge = text;
  huge.replace(at, 11, "\"width\": 1.7e27");
  std::ofstream(tmp.file("huge.json")) << huge;
  try {
    load_manifest(tmp.file("huge.json"));
    FAIL() << "accepted a float width";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("field 'width' is number 1.7e+27, not a 64-bit integer"), std::string::npos)
        << e.what();
  }
  std::ofstream(tmp.file("bad.json")) << "{ not json";
  EXPECT_THROW(load_manifest(tmp.file("bad.json")), CorruptInput);
  EXPECT_THROW(scan_image_folder(tmp.file("nowhere")), IoError);
}

TEST(ImageFolder, DecodingConvertsDepthAlphaAndChannels) {
  test_util::TempDir tmp;
  const std::string root = make_tree(tmp);
  const io::Image rgb = io::decode_image(root + "/a.png", 3);
  ASSERT_EQ(rgb.width, 40);
  ASSERT_EQ(rgb.channels, 3);
  EXPECT_EQ(rgb.pixels[0], 30);  // written as BGR (10, 20, 30): red first once decoded
  EXPECT_EQ(rgb.pixels[2], 10);
  const io::Image gray = io::decode_image(root + "/a.png", 1);
  EXPECT_EQ(gray.channels, 1);
  EXPECT_NEAR(gray.pixels[0], 0.299 * 30 + 0.587 * 20 + 0.114 * 10, 1.0);
  const io::Image replicated = io::decode_image(root + "/sub/b.jpg", 3);
  EXPECT_NEAR(replicated.pixels[0], 128, 2);
  EXPECT_EQ(replicated.pixels[0], replicated.pixels[1]);
  EXPECT_EQ(io::decode_image(root + "/d.tif", 1).pixels[0], 255);  // 16-bit full scale
  const io::Image transparent = io::decode_image(root + "/e.png", 3);
  for (uint8_t p : transparent.pixels) ASSERT_EQ(p, 0);  // alpha 0 on black
  try {
    io::decode_image(root + "/broken.png", 3);
    FAIL() << "decoded a truncated PNG";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("broken.png"), std::string::npos) << e.what();
  }
  EXPECT_THROW(io::decode_image(root + "/missing.png", 3), IoError);
  EXPECT_THROW(io::decode_image(root + "/a.png", 2), InvalidArgument);
}

TEST(ImageFolder, DecodesPalettePngsWithAndWithoutTransparencyAnd16BitColour) {
  test_util::TempDir tmp;
  const std::vector<uint8_t> palette = {255, 0, 0, 0, 0, 255};    // red, blue
  const std::vector<uint8_t> indices = {0, 1, 1, 0, 0, 0, 1, 1};  // 4 x 2
  write_palette_png(tmp.file("opaque.png"), 4, 2, palette, {}, indices);
  write_palette_png(tmp.file("clear.png"), 4, 2, palette, {255, 0}, indices);  // blue fully transparent
  const io::Image opaque = io::decode_image(tmp.file("opaque.png"), 3);
  ASSERT_EQ(opaque.width, 4);
  ASSERT_EQ(opaque.height, 2);
  EXPECT_EQ(std::vector<uint8_t>(opaque.pixels.begin(), opaque.pixels.begin() + 6),
            (std::vector<uint8_t>{255, 0, 0, 0, 0, 255}));
  const io::Image clear = io::decode_image(tmp.file("clear.png"), 3);
  EXPECT_EQ(std::vector<uint8_t>(clear.pixels.begin(), clear.pixels.begin() + 6),
            (std::vector<uint8_t>{255, 0, 0, 0, 0, 0}));                              // blue composited on black
  write(tmp.file("deep.png"), cv::Mat(3, 5, CV_16UC3, cv::Scalar(0, 32896, 65535)));  // BGR, 16 bits
  const io::Image deep = io::decode_image(tmp.file("deep.png"), 3);
  EXPECT_EQ(std::vector<uint8_t>(deep.pixels.begin(), deep.pixels.begin() + 3), (std::vector<uint8_t>{255, 128, 0}));
  // The manifest knows their sizes too.
  const Manifest m = scan_image_folder(tmp.path());
  ASSERT_EQ(m.entries.size(), 3u);
  for (const auto& e : m.entries) EXPECT_TRUE(e.readable()) << e.path << ": " << e.error;
}

TEST(ImageFolder, TruncatedJpegsAndPngsAreUnreadableWithoutNoiseButTrailingBytesAreFine) {
  test_util::TempDir tmp;
  cv::Mat photo(48, 64, CV_8UC3);
  cv::randu(photo, cv::Scalar::all(0), cv::Scalar::all(255));
  std::vector<uchar> jpeg, png;
  ASSERT_TRUE(cv::imencode(".jpg", photo, jpeg));
  ASSERT_TRUE(cv::imencode(".png", photo, png));
  auto save = [&](const std::string& name, const std::vector<uchar>& bytes, size_t size, const std::string& extra) {
    std::ofstream out(tmp.file(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(size));
    out << extra;
  };
  save("cut.jpg", jpeg, jpeg.size() * 2 / 3, "");  // libjpeg alone would fill the rest with grey
  save("tail.jpg", jpeg, jpeg.size(), std::string("\xff\xda") + " trailing bytes some cameras add");
  save("cut.png", png, png.size() * 2 / 3, "");
  save("whole.png", png, png.size(), "");
  testing::internal::CaptureStderr();
  const Manifest m = scan_image_folder(tmp.path());
  const std::string printed = testing::internal::GetCapturedStderr();
  ASSERT_EQ(m.entries.size(), 4u);  // cut.jpg, cut.png, tail.jpg, whole.png
  EXPECT_NE(m.entries[0].error.find("truncated JPEG: no end-of-image marker"), std::string::npos) << m.entries[0].error;
  EXPECT_NE(m.entries[1].error.find("truncated PNG"), std::string::npos) << m.entries[1].error;
  EXPECT_TRUE(m.entries[2].readable()) << m.entries[2].error;
  EXPECT_EQ(m.entries[2].width, 64);
  EXPECT_TRUE(m.entries[3].readable()) << m.entries[3].error;
  EXPECT_EQ(printed, "");  // nothing from libpng
  try {
    io::decode_image(tmp.file("cut.jpg"), 3);
    FAIL() << "decoded a truncated JPEG";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jpg: truncated JPEG"), std::string::npos) << e.what();
  }
}

// libjpeg decodes around corrupt data and, through OpenCV, printed "Corrupt JPEG data: ..." on
// stderr once per image on every rank. Decoded by lockstep with libjpeg directly, such a file is
// unreadable with libjpeg's words, and nothing is printed; padding before the end marker (which
// some cameras write) leaves the image readable.
TEST(ImageFolder, CorruptJpegDataIsNamedUnreadableAndNothingIsPrinted) {
  test_util::TempDir tmp;
  const std::string jpeg = encoded_noise(".jpg", 48, 64);
  ASSERT_FALSE(jpeg.empty());
  ASSERT_EQ(jpeg.compare(jpeg.size() - 2, 2, "\xFF\xD9"), 0);
  // An end marker in the middle of the scan: the rest of the image is missing.
  std::string cut_short = jpeg;
  size_t mid = cut_short.size() * 3 / 4;
  while (static_cast<unsigned char>(cut_short[mid - 1]) == 0xFF) ++mid;
  cut_short[mid] = '\xFF';
  cut_short[mid + 1] = '\xD9';
  std::ofstream(tmp.file("cut_short.jpg"), std::ios::binary) << cut_short;
  // Ten bytes of padding between the last scan and the end marker.
  std::ofstream(tmp.file("padded.jpg"), std::ios::binary)
      << jpeg.substr(0, jpeg.size() - 2) + std::string(10, '\0') + "\xFF\xD9";
  testing::internal::CaptureStderr();
  const Manifest m = scan_image_folder(tmp.path());
  EXPECT_THROW(io::decode_image(tmp.file("cut_short.jpg"), 3), CorruptInput);
  const io::Image padded = io::decode_image(tmp.file("padded.jpg"), 3);
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed, "");
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_EQ(m.entries[0].error.rfind("corrupt (libjpeg: Corrupt JPEG data: ", 0), 0u) << m.entries[0].error;
  EXPECT_TRUE(m.entries[1].readable()) << m.entries[1].error;
  EXPECT_EQ(padded.width, 64);
  // libjpeg's pixels are OpenCV's: the same decoder under both.
  const cv::Mat reference = cv::imdecode(std::vector<uchar>(jpeg.begin(), jpeg.end()), cv::IMREAD_COLOR);
  EXPECT_EQ(padded.pixels[0], reference.at<cv::Vec3b>(0, 0)[2]);  // R of OpenCV's BGR
  EXPECT_EQ(padded.pixels[5], reference.at<cv::Vec3b>(0, 1)[0]);  // B of the second pixel
}

TEST(ImageFolder, ScanningOnSeveralThreadsGivesTheSameManifestAndReportsProgressInOrder) {
  test_util::TempDir tmp;
  const std::string root = make_tree(tmp);
  for (int i = 0; i < 20; ++i) {
    write(root + "/many/" + std::to_string(i) + ".png", cv::Mat(3 + i, 4, CV_8UC1, cv::Scalar(i)));
  }
  const Manifest one = scan_image_folder(root, nullptr, {}, 1);
  std::vector<int64_t> reported;
  const auto caller = std::this_thread::get_id();
  const Manifest four = scan_image_folder(
      root, nullptr,
      [&](int64_t done, int64_t total) {
        EXPECT_EQ(total, 27);
        EXPECT_EQ(std::this_thread::get_id(), caller);  // callbacks need no locking
        reported.push_back(done);
      },
      4);
  ASSERT_EQ(one.entries.size(), 27u);
  ASSERT_EQ(four.entries.size(), one.entries.size());
  for (size_t i = 0; i < one.entries.size(); ++i) {
    EXPECT_EQ(four.entries[i].path, one.entries[i].path);
    EXPECT_EQ(four.entries[i].height, one.entries[i].height);
    EXPECT_EQ(four.entries[i].checksum, one.entries[i].checksum);
    EXPECT_EQ(four.entries[i].error, one.entries[i].error);
  }
  EXPECT_EQ(four.hash(), one.hash());
  ASSERT_FALSE(reported.empty());
  EXPECT_EQ(reported.back(), 27);
}

TEST(ImageFolder, ASymbolicLinkIsListedUnderItsOwnName) {
  test_util::TempDir tmp;
  write(tmp.file("elsewhere/x.png"), cv::Mat(4, 6, CV_8UC1, cv::Scalar(9)));
  fs::create_directories(tmp.file("root/sub"));
  fs::create_symlink(tmp.file("elsewhere/x.png"), tmp.file("root/sub/link.png"));
  const Manifest m = scan_image_folder(tmp.file("root") + "/");
  ASSERT_EQ(m.entries.size(), 1u);
  EXPECT_EQ(m.entries[0].path, "sub/link.png");
  EXPECT_EQ(m.entries[0].width, 6);
}

// What a folder holds besides images is listed, not lost and not fatal: a name that is not UTF-8
// (the manifest is JSON), a link that loops or points nowhere, a FIFO with an image's name.
TEST(ImageFolder, OddNamesLinksAndSpecialFilesAreUnreadableEntriesThatSayWhy) {
  test_util::TempDir tmp;
  const std::string root = tmp.file("root");
  write(root + "/good.png", cv::Mat(4, 6, CV_8UC1, cv::Scalar(9)));
  write(root + "/caf\xe9.png", cv::Mat(4, 6, CV_8UC1, cv::Scalar(9)));         // Latin-1, not UTF-8
  write(root + "/bad\xff/inside.png", cv::Mat(4, 6, CV_8UC1, cv::Scalar(9)));  // its directory's name
  write(root + "/caf\xc3\xa9.png", cv::Mat(4, 6, CV_8UC1, cv::Scalar(9)));     // UTF-8: fine
  fs::create_symlink("loop.png", root + "/loop.png");
  fs::create_symlink("nowhere.png", root + "/dangling.png");
  ASSERT_EQ(::mkfifo((root + "/pipe.png").c_str(), 0600), 0);
  fs::create_directories(root + "/dir.png");  // a directory with an image's name is only a directory

  const Manifest m = scan_image_folder(root);
  std::map<std::string, std::string> errors;
  for (const auto& e : m.entries) errors[e.path] = e.error;
  const std::map<std::string, std::string> expected_start = {
      {"bad\\xff/", "its name is not valid UTF-8"},
      {"caf\\xe9.png", "its name is not valid UTF-8"},
      {"caf\xc3\xa9.png", ""},
      {"dangling.png", "cannot be read (No such file or directory)"},
      {"good.png", ""},
      {"loop.png", "cannot be read (Too many levels of symbolic links)"},
      {"pipe.png", "is not a regular file"}};
  ASSERT_EQ(errors.size(), expected_start.size()) << testing::PrintToString(errors);
  for (const auto& [path, start] : expected_start) {
    ASSERT_TRUE(errors.count(path)) << path << " missing from " << testing::PrintToString(errors);
    EXPECT_EQ(errors[path].rfind(start, 0), 0u) << path << ": " << errors[path];
  }
  EXPECT_EQ(m.readable_count(), 2);
  // The manifest is valid JSON and reads back whole.
  save_manifest(tmp.file("manifest.json"), m);
  EXPECT_EQ(load_manifest(tmp.file("manifest.json")).hash(), m.hash());
}

// A directory that cannot be listed is an entry saying so (its images are missing from the run),
// not a silent gap. As root every directory can be listed, so a child process gives up root first.
TEST(ImageFolder, ADirectoryThatCannotBeListedIsNamed) {
  test_util::TempDir tmp;
  const std::string root = tmp.file("root");
  write(root + "/a.png", cv::Mat(4, 6, CV_8UC1, cv::Scalar(9)));
  write(root + "/closed/b.png", cv::Mat(4, 6, CV_8UC1, cv::Scalar(9)));
  fs::permissions(root + "/closed", fs::perms::none);
  fs::permissions(tmp.path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::string out;
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      out = "setuid failed";
    } else {
      try {
        for (const auto& e : scan_image_folder(root, nullptr, {}, 1).entries) out += e.path + "|" + e.error + "\n";
      } catch (const std::exception& e) {
        out = std::string("threw: ") + e.what();
      }
    }
    const ssize_t written = ::write(pipe_fds[1], out.data(), out.size());
    ::_exit(written == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  ::close(pipe_fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  fs::permissions(root + "/closed", fs::perms::owner_all);  // so that the directory can be removed
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << got;
  EXPECT_EQ(got,
            "a.png|\n"
            "closed/|cannot list this directory (Permission denied): its images are not used\n");
}

// Limits checked before reading or decoding: a header claiming 30000x30000 pixels (a few bytes
// that would decode to 2.7 GB) and a file over the size limit (sparse: it takes no disk).
TEST(ImageFolder, ImagesOverThePixelOrByteLimitAreUnreadableWithTheFigures) {
  test_util::TempDir tmp;
  std::vector<uchar> png;
  ASSERT_TRUE(cv::imencode(".png", cv::Mat(3, 3, CV_8UC1, cv::Scalar(1)), png));
  std::string claimed(png.begin(), png.end());
  for (int k = 0; k < 2; ++k) {  // IHDR's width and height, big-endian, at bytes 16 and 20
    const uint32_t v = 30000;
    for (int b = 0; b < 4; ++b) claimed[16 + 4 * k + b] = static_cast<char>((v >> (24 - 8 * b)) & 0xFF);
  }
  std::ofstream(tmp.file("claims.png"), std::ios::binary) << claimed;
  {
    std::ofstream huge(tmp.file("huge.png"), std::ios::binary);
    huge.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  }
  fs::resize_file(tmp.file("huge.png"), io::kMaxImageFileBytes + 1);
  const Manifest m = scan_image_folder(tmp.path());
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_NE(m.entries[0].error.find("PNG of 30000x30000 pixels: over the limit of 268435456 pixels"), std::string::npos)
      << m.entries[0].error;
  EXPECT_NE(m.entries[1].error.find("1073741825 bytes, over the limit of 1073741824 bytes"), std::string::npos)
      << m.entries[1].error;
  EXPECT_THROW(io::decode_image(tmp.file("claims.png"), 1), CorruptInput);
}

// libpng warns on stderr about colour profiles it dislikes (once per image, on every rank): the
// metadata chunks lockstep does not use never reach it.
TEST(ImageFolder, PngMetadataLibpngWarnsAboutStaysOffStderr) {
  test_util::TempDir tmp;
  std::vector<uchar> encoded;
  ASSERT_TRUE(cv::imencode(".png", cv::Mat(5, 7, CV_8UC3, cv::Scalar(1, 2, 3)), encoded));
  const std::string png(encoded.begin(), encoded.end());
  // An iCCP chunk (profile "x", deflate) whose profile is not an ICC profile, after IHDR.
  std::string body = std::string("iCCPx\0\0", 7);
  const std::string garbage = "this is not an ICC colour profile";
  uLongf size = compressBound(static_cast<uLong>(garbage.size()));
  std::string packed(size, '\0');
  compress(reinterpret_cast<Bytef*>(packed.data()), &size, reinterpret_cast<const Bytef*>(garbage.data()),
           static_cast<uLong>(garbage.size()));
  body += packed.substr(0, size);
  std::string chunk;
  for (uint32_t v : {static_cast<uint32_t>(body.size() - 4)}) {
    for (int s = 24; s >= 0; s -= 8) chunk += static_cast<char>((v >> s) & 0xFF);
  }
  chunk += body;
  const auto crc =
      static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
  for (int s = 24; s >= 0; s -= 8) chunk += static_cast<char>((crc >> s) & 0xFF);
  const std::string with_profile = png.substr(0, 33) + chunk + png.substr(33);  // signature 8 + IHDR 25
  std::ofstream(tmp.file("profile.png"), std::ios::binary) << with_profile;

  // The test's premise: handed the whole file, libpng (through OpenCV) does print a warning.
  testing::internal::CaptureStderr();
  const cv::Mat direct = cv::imdecode(std::vector<uchar>(with_profile.begin(), with_profile.end()), cv::IMREAD_COLOR);
  const std::string printed_direct = testing::internal::GetCapturedStderr();
  ASSERT_FALSE(direct.empty());
  ASSERT_NE(printed_direct, "") << "libpng printed nothing for this iCCP chunk: the test proves nothing";

  testing::internal::CaptureStderr();
  const Manifest m = scan_image_folder(tmp.path());
  const io::Image image = io::decode_image(tmp.file("profile.png"), 3);
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed, "");
  ASSERT_EQ(m.entries.size(), 1u);
  EXPECT_TRUE(m.entries[0].readable()) << m.entries[0].error;
  EXPECT_EQ(image.width, 7);
  EXPECT_EQ(image.pixels[0], 3);  // RGB of the BGR scalar: the pixels are untouched
}

// A PNG whose pixel data is damaged (a CRC that does not match; compressed data that decodes to
// bad filter bytes) made libpng, through OpenCV, print "libpng error: ..." before it failed. Read
// through libpng's simplified API first, each is named in the manifest and nothing is printed.
TEST(ImageFolder, DamagedPngDataIsNamedAndStaysOffStderr) {
  test_util::TempDir tmp;
  const std::string png = encoded_noise(".png", 24, 32);
  ASSERT_FALSE(png.empty());
  const size_t idat = png.find("IDAT") - 4;  // the chunk's length field
  const uint32_t length = (uint32_t(uint8_t(png[idat])) << 24) | (uint32_t(uint8_t(png[idat + 1])) << 16) |
                          (uint32_t(uint8_t(png[idat + 2])) << 8) | uint32_t(uint8_t(png[idat + 3]));
  std::string bad_crc = png;
  bad_crc[idat + 8 + length] ^= 1;
  std::string bad_data = png;
  bad_data[idat + 8 + length / 2] ^= static_cast<char>(0xFF);
  const auto crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bad_data.data() + idat + 4), static_cast<uInt>(length + 4)));
  for (int b = 0; b < 4; ++b) bad_data[idat + 8 + length + b] = static_cast<char>((crc >> (24 - 8 * b)) & 0xFF);
  std::ofstream(tmp.file("crc.png"), std::ios::binary) << bad_crc;
  std::ofstream(tmp.file("data.png"), std::ios::binary) << bad_data;

  // The test's premise: OpenCV alone prints libpng's error for such a file.
  testing::internal::CaptureStderr();
  const cv::Mat direct = cv::imdecode(std::vector<uchar>(bad_crc.begin(), bad_crc.end()), cv::IMREAD_COLOR);
  ASSERT_NE(testing::internal::GetCapturedStderr(), "") << "OpenCV printed nothing: the test proves nothing";
  EXPECT_TRUE(direct.empty());

  testing::internal::CaptureStderr();
  const Manifest m = scan_image_folder(tmp.path());
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed, "");
  ASSERT_EQ(m.entries.size(), 2u);  // crc.png, data.png
  EXPECT_NE(m.entries[0].error.find("corrupt (libpng: IDAT: CRC error)"), std::string::npos) << m.entries[0].error;
  EXPECT_NE(m.entries[1].error.find("corrupt (libpng: "), std::string::npos) << m.entries[1].error;
  EXPECT_THROW(io::decode_image(tmp.file("crc.png"), 3), CorruptInput);
}

TEST(ImageFolder, TheHeldOutSetDependsOnThePathsAloneAndSkipsUnreadableFiles) {
  test_util::TempDir tmp;
  const std::string root = make_tree(tmp);
  const Manifest m = scan_image_folder(root);
  const std::vector<int64_t> two = held_out_entries(m, 2);
  ASSERT_EQ(two.size(), 2u);
  for (int64_t id : two) EXPECT_TRUE(m.entries[static_cast<size_t>(id)].readable());
  std::vector<std::string> held;
  for (int64_t id : two) held.push_back(m.entries[static_cast<size_t>(id)].path);
  // More files around them do not change which ones are held out (only a lower hash could).
  for (int i = 0; i < 6; ++i) write(root + "/more/m" + std::to_string(i) + ".png", cv::Mat(4, 4, CV_8UC1));
  const Manifest bigger = scan_image_folder(root);
  const std::vector<int64_t> again = held_out_entries(bigger, 2);
  std::set<std::string> lowest_before(held.begin(), held.end());
  size_t kept = 0;
  for (int64_t id : again) kept += lowest_before.count(bigger.entries[static_cast<size_t>(id)].path);
  std::set<std::string> new_files;
  for (int64_t id : again) {
    const auto& p = bigger.entries[static_cast<size_t>(id)].path;
    if (!lowest_before.count(p)) new_files.insert(p);
  }
  for (const auto& p : new_files) EXPECT_EQ(p.rfind("more/", 0), 0u) << p;  // displaced only by a new file
  EXPECT_EQ(kept + new_files.size(), 2u);
  EXPECT_THROW(held_out_entries(m, m.readable_count()), InvalidArgument);
  EXPECT_TRUE(held_out_entries(m, 0).empty());
}

TEST(ImageFolder, ChangesBetweenTwoManifestsAreNamed) {
  test_util::TempDir tmp;
  const std::string root = make_tree(tmp);
  const Manifest before = scan_image_folder(root);
  EXPECT_EQ(describe_changes(before, before), "");
  fs::remove(root + "/d.tif");
  write(root + "/z.png", cv::Mat(4, 4, CV_8UC1, cv::Scalar(1)));
  write(root + "/a.png", cv::Mat(30, 40, CV_8UC3, cv::Scalar(99, 20, 30)));  // same size, other pixels
  const Manifest after = scan_image_folder(root);
  EXPECT_EQ(describe_changes(before, after), "1 added (z.png), 1 removed (d.tif), 1 modified (a.png)");
  EXPECT_NE(before.hash(), after.hash());
}

TEST(ImageFolder, KnowsImageFilesByExtension) {
  for (const char* name : {"x.png", "X.JPG", "a.b.jpeg", "y.webp", "z.TIFF", "w.bmp", "v.pgm"}) {
    EXPECT_TRUE(io::is_image_file(name)) << name;
  }
  for (const char* name : {"x.txt", "png", "x.png.bak", "README"}) EXPECT_FALSE(io::is_image_file(name)) << name;
}

}  // namespace
}  // namespace lockstep::data
#endif  // LOCKSTEP_HAVE_OPENCV
