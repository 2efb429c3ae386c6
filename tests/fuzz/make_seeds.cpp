// Writes the committed seed corpus (tests/fuzz/corpus/TARGET/NAME) with lockstep's own writers and
// OpenCV's encoders, so every seed is a valid file of its kind for the fuzzer to mutate:
//   build-fuzz/make_seeds tests/fuzz/corpus
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <opencv2/imgcodecs.hpp>
#include <string>
#include <vector>

#include "lockstep/data/manifest.h"
#include "lockstep/io/npy.h"
#include "lockstep/io/safetensors.h"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

fs::path corpus;

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(corpus / target);
  std::ofstream(corpus / target / name, std::ios::binary) << bytes;
}

std::string gzip(const std::string& in) {
  z_stream zs{};
  deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, in.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

io::RawTensor tensor(io::DType dtype, std::vector<int64_t> shape) {
  io::RawTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<size_t>(t.numel()) * io::dtype_size(dtype));
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<char>(i * 37 + 1);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_seeds CORPUS_DIR\n";
    return 2;
  }
  corpus = argv[1];

  io::SafetensorsData checkpoint;
  checkpoint.tensors["model.weight"] = tensor(io::DType::F32, {2, 3});
  checkpoint.tensors["optim.step"] = tensor(io::DType::I64, {});
  checkpoint.tensors["mask"] = tensor(io::DType::Bool, {4});
  checkpoint.metadata = {{"format", "lockstep"}, {"step", "10"}};
  seed("fuzz_safetensors", "checkpoint", io::encode_safetensors(checkpoint));
  seed("fuzz_safetensors", "empty", io::encode_safetensors(io::SafetensorsData{}));

  seed("fuzz_npy", "tokens_i32", io::encode_npy(tensor(io::DType::I32, {2, 4, 4})));
  seed("fuzz_npy", "f16_scalar", io::encode_npy(tensor(io::DType::F16, {})));
  seed("fuzz_npy", "u8_empty", io::encode_npy(tensor(io::DType::U8, {0, 3})));

  const std::string images =
      std::string("\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x03", 16) + std::string(18, '\x7f');
  const std::string labels = std::string("\x00\x00\x08\x01\x00\x00\x00\x02", 8) + "\x01\x09";
  seed("fuzz_idx", "images", images);
  seed("fuzz_idx", "labels.gz", gzip(labels));
  seed("fuzz_idx", "images.gz", gzip(images));

  data::Manifest manifest;
  manifest.root = "photos";
  manifest.entries.push_back({"a.png", 64, 48, 1234, 1700000000000000000, 42, ""});
  manifest.entries.push_back({"sub/b.jpg", 0, 0, 10, 1700000000000000001, 7, "truncated JPEG"});
  const fs::path manifest_file = corpus / "manifest.tmp.json";
  data::save_manifest(manifest_file.string(), manifest);
  std::ifstream in(manifest_file, std::ios::binary);
  seed("fuzz_manifest", "two_entries", std::string(std::istreambuf_iterator<char>(in), {}));
  fs::remove(manifest_file);

  const std::pair<const char*, cv::Mat> pictures[] = {
      {".png", cv::Mat(5, 7, CV_8UC3, cv::Scalar(1, 2, 3))}, {".png", cv::Mat(3, 2, CV_16UC1, cv::Scalar(9))},
      {".jpg", cv::Mat(8, 8, CV_8UC1, cv::Scalar(200))},     {".webp", cv::Mat(4, 6, CV_8UC3, cv::Scalar(5))},
      {".tiff", cv::Mat(3, 5, CV_8UC3, cv::Scalar(7))},      {".bmp", cv::Mat(2, 3, CV_8UC3, cv::Scalar(8))},
      {".pgm", cv::Mat(4, 4, CV_8UC1, cv::Scalar(100))},     {".ppm", cv::Mat(2, 2, CV_8UC3, cv::Scalar(50))}};
  int n = 0;
  for (const auto& [extension, mat] : pictures) {
    std::vector<uchar> bytes;
    cv::imencode(extension, mat, bytes);
    seed("fuzz_image_header", "image" + std::to_string(n++) + extension, std::string(bytes.begin(), bytes.end()));
  }

  seed("fuzz_config_toml", "every_key",
       "[train]\nflag = true\ncount = 12\nrate = 2.5e-4\nany = -inf\ndevice = \"gpu:1\"\n"
       "[data]\nkind = \"vq\"\npath = \"images/\\u00e9t\\u00e9\" # comment\n"
       "[model]\nchannels = [8, 16,\n 32]\n[quantizer.fsq]\nscales = [0.5, 1e3]\ndeep.level = 7\n");
  seed("fuzz_config_toml", "dotted_and_inline", "train.count = 3\nquantizer = { fsq = { scales = [] } }\n");
  seed("fuzz_config_override", "lines",
       "train.count=5\nmodel.channels=[8,16]\nmodel.channels=4,8\ndata.kind=lfq\ndata.path=\"a b\"\n"
       "train.rate=1e-3\ntrain.flag=true\nquantizer.fsq.deep.level=0\ntrain.device=cpu\n");
  std::cout << "seeds written under " << corpus.string() << "\n";
  return 0;
}
