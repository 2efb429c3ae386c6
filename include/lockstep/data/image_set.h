// An in-memory set of same-sized 8-bit images with optional labels, and Fashion-MNIST loading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data {

struct ImageSet {
  int64_t count = 0;
  int channels = 1;
  int height = 0;
  int width = 0;
  std::vector<uint8_t> pixels;  // count * channels * height * width, channel-first per image
  std::vector<uint8_t> labels;  // count labels, or empty
};

enum class Split { Train, Test };

// Where Debian's dataset-fashion-mnist package installs the files.
constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

// Loads `{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz` from `dir`. A missing directory or
// file throws IoError that names the file and says to install the Debian package
// `dataset-fashion-mnist` (or run scripts/install-deps); corrupt files throw CorruptInput;
// image and label counts that differ throw CorruptInput with both counts.
ImageSet load_fashion_mnist(const std::string& dir, Split split);

// The image and label file paths for `split` in `dir`.
std::string fashion_mnist_images_path(const std::string& dir, Split split);
std::string fashion_mnist_labels_path(const std::string& dir, Split split);

struct FashionMnistStatus {
  std::string dir;
  bool found = false;                      // all four files are present
  std::vector<std::string> missing_files;  // full paths of the absent files
};

// Checks that the Fashion-MNIST files exist in `dir` (the layout of load_fashion_mnist). Does not
// read or validate them. Never throws.
FashionMnistStatus locate_fashion_mnist(const std::string& dir);

}  // namespace lockstep::data
