#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <string>

#include "data/idx_writer.h"
#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/data/image_set.h"

namespace {

using lockstep::data::FashionMnistStatus;
using lockstep::data::ImageSet;
using lockstep::data::load_fashion_mnist;
using lockstep::data::locate_fashion_mnist;
using lockstep::data::Split;
using lockstep::test_util::make_idx;
using lockstep::test_util::pattern;
using lockstep::test_util::TempDir;
using lockstep::test_util::write_gzip;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "missing '" << (needle) << "' in: " << (haystack)

// Fashion-MNIST is class-balanced: every class has the same number of examples in each split.
void expect_real_split(const ImageSet& set, int64_t count) {
  EXPECT_EQ(set.count, count);
  EXPECT_EQ(set.channels, 1);
  EXPECT_EQ(set.height, 28);
  EXPECT_EQ(set.width, 28);
  ASSERT_EQ(set.pixels.size(), static_cast<std::size_t>(count * 28 * 28));
  ASSERT_EQ(set.labels.size(), static_cast<std::size_t>(count));
  std::array<int64_t, 10> per_class{};
  for (uint8_t l : set.labels) {
    ASSERT_LT(l, 10);
    ++per_class[l];
  }
  for (int64_t n : per_class) EXPECT_EQ(n, count / 10);
  uint64_t sum = 0;
  for (uint8_t p : set.pixels) sum += p;
  const double mean = static_cast<double>(sum) / static_cast<double>(set.pixels.size());
  EXPECT_GT(mean, 60.0);  // the well-known mean intensity is about 72.9 / 255
  EXPECT_LT(mean, 85.0);
}

TEST(FashionMnist, LoadsTheInstalledTrainSplit) {
  const ImageSet set = load_fashion_mnist(LOCKSTEP_FASHION_MNIST_DIR, Split::Train);
  expect_real_split(set, 60000);
  EXPECT_EQ(set.labels[0], 9);  // the first training image is an ankle boot
}

TEST(FashionMnist, LoadsTheInstalledTestSplit) {
  expect_real_split(load_fashion_mnist(LOCKSTEP_FASHION_MNIST_DIR, Split::Test), 10000);
}

TEST(FashionMnist, PathsFollowTheUpstreamNames) {
  EXPECT_EQ(lockstep::data::fashion_mnist_images_path("/d", Split::Train), "/d/train-images-idx3-ubyte.gz");
  EXPECT_EQ(lockstep::data::fashion_mnist_labels_path("/d", Split::Test), "/d/t10k-labels-idx1-ubyte.gz");
}

TEST(FashionMnist, MissingDirectorySaysWhichPackageToInstall) {
  TempDir dir;
  const std::string missing = dir.file("nowhere");
  try {
    load_fashion_mnist(missing, Split::Train);
    FAIL() << "expected IoError";
  } catch (const lockstep::IoError& e) {
    EXPECT_CONTAINS(e.what(), missing + "/train-images-idx3-ubyte.gz");
    EXPECT_CONTAINS(e.what(), "dataset-fashion-mnist");
    EXPECT_CONTAINS(e.what(), "scripts/install-deps");
  }
}

TEST(FashionMnist, MissingLabelFileIsNamed) {
  TempDir dir;
  write_gzip(dir.file("t10k-images-idx3-ubyte.gz"), make_idx({2, 3, 3}, pattern(18)));
  try {
    load_fashion_mnist(dir.path(), Split::Test);
    FAIL() << "expected IoError";
  } catch (const lockstep::IoError& e) {
    EXPECT_CONTAINS(e.what(), dir.file("t10k-labels-idx1-ubyte.gz"));
    EXPECT_CONTAINS(e.what(), "dataset-fashion-mnist");
  }
}

TEST(FashionMnist, SmallFilesLoadWithTheirShape) {
  TempDir dir;
  write_gzip(dir.file("t10k-images-idx3-ubyte.gz"), make_idx({2, 3, 4}, pattern(24)));
  write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), make_idx({2}, std::string{7, 3}));
  const ImageSet set = load_fashion_mnist(dir.path(), Split::Test);
  EXPECT_EQ(set.count, 2);
  EXPECT_EQ(set.height, 3);
  EXPECT_EQ(set.width, 4);
  EXPECT_EQ(std::string(set.pixels.begin(), set.pixels.end()), pattern(24));
  EXPECT_EQ(set.labels, (std::vector<uint8_t>{7, 3}));
}

TEST(FashionMnist, InconsistentFilesAreCorruptInput) {
  TempDir dir;
  const std::string images = dir.file("train-images-idx3-ubyte.gz");
  const std::string labels = dir.file("train-labels-idx1-ubyte.gz");
  write_gzip(images, make_idx({3, 2, 2}, pattern(12)));
  write_gzip(labels, make_idx({2}, std::string(2, '\1')));
  try {
    load_fashion_mnist(dir.path(), Split::Train);
    FAIL() << "expected CorruptInput";
  } catch (const lockstep::CorruptInput& e) {
    EXPECT_CONTAINS(e.what(), "3 images");
    EXPECT_CONTAINS(e.what(), "2 labels");
    EXPECT_CONTAINS(e.what(), images);
    EXPECT_CONTAINS(e.what(), labels);
  }
  write_gzip(images, make_idx({3, 4}, pattern(12)));  // 2-D images
  write_gzip(labels, make_idx({3}, std::string(3, '\1')));
  EXPECT_THROW(load_fashion_mnist(dir.path(), Split::Train), lockstep::CorruptInput);
  write_gzip(images, make_idx({3, 2, 2}, pattern(12)));
  write_gzip(labels, make_idx({3}, std::string{1, 10, 2}));  // class 10 does not exist
  EXPECT_THROW(load_fashion_mnist(dir.path(), Split::Train), lockstep::CorruptInput);
  write_gzip(labels, make_idx({3, 1}, std::string(3, '\1')));  // 2-D labels
  EXPECT_THROW(load_fashion_mnist(dir.path(), Split::Train), lockstep::CorruptInput);
}

TEST(LocateFashionMnist, ReportsAllFilesMissingInAnEmptyDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep_machine_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const FashionMnistStatus status = locate_fashion_mnist(dir.string());
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(status.found);
  EXPECT_EQ(status.dir, dir.string());
  ASSERT_EQ(status.missing_files.size(), 4u);
  for (const auto& path : status.missing_files) {
    EXPECT_EQ(path.rfind(dir.string(), 0), 0u) << path;
  }
}

TEST(LocateFashionMnist, ReportsMissingForANonexistentDirectory) {
  const FashionMnistStatus status = locate_fashion_mnist("/nonexistent/lockstep/fashion-mnist");
  EXPECT_FALSE(status.found);
  EXPECT_EQ(status.missing_files.size(), 4u);
}

TEST(LocateFashionMnist, FindsTheInstalledPackage) {
  const FashionMnistStatus status = locate_fashion_mnist(LOCKSTEP_FASHION_MNIST_DIR);
  EXPECT_TRUE(status.found) << "install dataset-fashion-mnist; missing: "
                            << (status.missing_files.empty() ? "" : status.missing_files.front());
  EXPECT_TRUE(status.missing_files.empty());
}

}  // namespace
