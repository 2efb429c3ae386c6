#include "lockstep/data/image_set.h"

#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/data/idx.h"

namespace lockstep::data {
namespace {

constexpr int kFashionMnistClasses = 10;
constexpr int64_t kMaxSide = 65535;  // keeps height and width representable as int
constexpr const char* kInstallHint =
    "install the Debian package `dataset-fashion-mnist` (e.g. `apt-get install dataset-fashion-mnist`, "
    "or run `scripts/install-deps`)";

std::string split_prefix(Split split) { return split == Split::Train ? "train" : "t10k"; }

std::string join(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

// Checked before reading so that a missing dataset says how to get it, not just "cannot open".
void require_file(const std::string& dir, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw IoError(detail::concat("Fashion-MNIST directory '", dir, "' does not exist (looking for '", path, "'); ",
                                 kInstallHint));
  }
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw IoError(detail::concat("Fashion-MNIST file '", path, "' is missing; ", kInstallHint));
  }
}

}  // namespace

std::string fashion_mnist_images_path(const std::string& dir, Split split) {
  return join(dir, split_prefix(split) + "-images-idx3-ubyte.gz");
}

std::string fashion_mnist_labels_path(const std::string& dir, Split split) {
  return join(dir, split_prefix(split) + "-labels-idx1-ubyte.gz");
}

ImageSet load_fashion_mnist(const std::string& dir, Split split) {
  const std::string images_path = fashion_mnist_images_path(dir, split);
  const std::string labels_path = fashion_mnist_labels_path(dir, split);
  require_file(dir, images_path);
  require_file(dir, labels_path);

  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  LOCKSTEP_THROW_IF_NOT(images.dims.size() == 3, CorruptInput, images_path, ": Fashion-MNIST images must be 3-D ",
                        "(count, height, width) but have ", images.dims.size(), " dimensions");
  LOCKSTEP_THROW_IF_NOT(labels.dims.size() == 1, CorruptInput, labels_path, ": Fashion-MNIST labels must be 1-D ",
                        "but have ", labels.dims.size(), " dimensions");
  LOCKSTEP_THROW_IF_NOT(images.dims[0] == labels.dims[0], CorruptInput, "Fashion-MNIST has ", images.dims[0],
                        " images in '", images_path, "' but ", labels.dims[0], " labels in '", labels_path, "'");
  LOCKSTEP_THROW_IF_NOT(images.dims[1] <= kMaxSide && images.dims[2] <= kMaxSide, CorruptInput, images_path,
                        ": image size ", images.dims[1], "x", images.dims[2], " exceeds ", kMaxSide, " per side");
  for (std::size_t i = 0; i < labels.data.size(); ++i) {
    LOCKSTEP_THROW_IF_NOT(labels.data[i] < kFashionMnistClasses, CorruptInput, labels_path, ": label ",
                          int(labels.data[i]), " at index ", i, " is not a class 0..", kFashionMnistClasses - 1);
  }

  ImageSet set;
  set.count = images.dims[0];
  set.channels = 1;
  set.height = static_cast<int>(images.dims[1]);
  set.width = static_cast<int>(images.dims[2]);
  set.pixels = std::move(images.data);
  set.labels = std::move(labels.data);
  return set;
}

FashionMnistStatus locate_fashion_mnist(const std::string& dir) {
  FashionMnistStatus status;
  status.dir = dir;
  for (auto split : {Split::Train, Split::Test}) {
    for (const auto& path : {fashion_mnist_images_path(dir, split), fashion_mnist_labels_path(dir, split)}) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(path, ec)) status.missing_files.push_back(path);
    }
  }
  status.found = status.missing_files.empty();
  return status;
}

}  // namespace lockstep::data
