// lockstep encode: images -> token ids, saved as a .npy array NumPy reads directly.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <map>

#include "cli_common.h"
#include "commands.h"
#include "folder_input.h"
#include "lockstep/core/error.h"
#include "lockstep/data/batch.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/io/npy.h"
#include "lockstep/io/tensor_convert.h"
#include "lockstep/train/model_factory.h"

namespace lockstep::cli {
namespace {

struct EncodeArgs {
  std::string checkpoint;
  std::string output;
  std::vector<std::string> images;
  std::string data_dir;
  std::string split = "test";
  int64_t limit = 0;
  int64_t batch_size = 500;
  int threads = 0;
  bool weight_average = false;
};

data::ImageSet load_inputs(const EncodeArgs& args, const train::TrainedModel& t) {
  const int channels = static_cast<int>(t.model->options().in_channels());
  if (!args.images.empty()) {
    std::vector<io::Image> images;
    for (const auto& path : args.images) {
      images.push_back(io::load_png(path, channels));
      LOCKSTEP_CHECK_ARG(images.back().width == images.front().width && images.back().height == images.front().height,
                         path, " is ", images.back().width, "x", images.back().height, " but ", args.images.front(),
                         " is ", images.front().width, "x", images.front().height,
                         "; encode images of one size per call");
    }
    return data::image_set_from_images(images, channels);
  }
  const std::string dir = args.data_dir.empty() ? t.settings.data.dir() : args.data_dir;
  data::ImageSet set = data::load_fashion_mnist(dir, args.split == "train" ? data::Split::Train : data::Split::Test);
  return data::first_images(std::move(set), args.limit);
}

// A folder: one .npy of tokens per bucket in the output directory, and index.json naming the
// source image of every row (and the files that could not be decoded).
int encode_folder(const EncodeArgs& args, train::TrainedModel& t, const std::string& dir) {
  const FolderInput input = open_folder_input(t, args.checkpoint, dir, FolderSelection::All, args.limit);
  std::filesystem::create_directories(args.output);
  nlohmann::json index = {{"format", kTokenIndexFormat},
                          {"checkpoint", t.checkpoint},
                          {"folder", dir},
                          {"buckets", nlohmann::json::array()},
                          {"unreadable", nlohmann::json::array()}};
  std::map<size_t, std::vector<at::Tensor>> tokens;
  std::map<size_t, nlohmann::json> paths;
  for_each_batch(input, static_cast<int>(t.model->options().in_channels()), args.batch_size,
                 [&](size_t bucket, const std::vector<int64_t>& ids, const at::Tensor& x) {
                   check_forward_fits(*t.model, x.size(0), x.size(3), x.size(2));
                   tokens[bucket].push_back(t.model->encode(x));
                   for (int64_t id : ids) paths[bucket].push_back(input.manifest.entries[static_cast<size_t>(id)].path);
                 });
  for (const auto& [bucket, parts] : tokens) {
    const data::BucketSize size = input.table[bucket];
    const at::Tensor all = torch::cat(parts).to(torch::kInt32);
    const std::string file = std::to_string(size.width) + "x" + std::to_string(size.height) + ".npy";
    io::save_npy((std::filesystem::path(args.output) / file).string(), io::to_raw(all));
    index["buckets"].push_back(
        {{"width", size.width}, {"height", size.height}, {"file", file}, {"paths", paths[bucket]}});
    std::cout << "encoded " << all.size(0) << " images of " << size.width << "x" << size.height
              << " into tokens of shape " << all.sizes() << " -> " << file << "\n";
  }
  for (const auto& e : input.manifest.entries) {
    if (!e.readable()) index["unreadable"].push_back({{"path", e.path}, {"error", e.error}});
  }
  io::write_file_atomic((std::filesystem::path(args.output) / kTokenIndexFile).string(), index.dump(1) + "\n");
  std::cout << "encoded " << input.images() << " images of " << dir << " (int32 tokens, codebook of "
            << t.model->quantizer().codebook_size() << ") into " << args.output << "/; " << index["unreadable"].size()
            << " unreadable files left out (listed in " << kTokenIndexFile << ")\n";
  return kExitOk;
}

int run_encode(const EncodeArgs& args) {
  apply_threads(args.threads);
  train::TrainedModel t = train::load_trained_model(args.checkpoint, args.weight_average);
  const std::string dir = args.data_dir.empty() ? t.settings.data.dir() : args.data_dir;
  // The run's own data: its folder even when that folder has moved (the error then says so); other
  // data: a folder unless it holds Fashion-MNIST's files.
  const bool folder_run = t.settings.data.dataset() == "folder";
  if (args.images.empty() &&
      ((args.data_dir.empty() && folder_run) || (!args.data_dir.empty() && is_image_folder(dir))))
    return encode_folder(args, t, dir);
  const data::ImageSet set = load_inputs(args, t);
  LOCKSTEP_CHECK_ARG(set.count > 0, "no images to encode");
  std::vector<at::Tensor> parts;
  check_forward_fits(*t.model, std::min(args.batch_size, set.count), set.width, set.height);
  for (int64_t first = 0; first < set.count; first += args.batch_size) {
    const int64_t count = std::min(args.batch_size, set.count - first);
    parts.push_back(t.model->encode(data::images_to_tensor(set, first, count)));
  }
  const at::Tensor tokens = torch::cat(parts).to(torch::kInt32);
  io::save_npy(args.output, io::to_raw(tokens));
  std::cout << "encoded " << set.count << " images of " << set.height << "x" << set.width << " into tokens of shape "
            << tokens.sizes() << " (int32, codebook of " << t.model->quantizer().codebook_size() << ") -> "
            << args.output << "\n";
  return kExitOk;
}

}  // namespace

void add_encode_command(CLI::App& app, Runner& run) {
  auto args = std::make_shared<EncodeArgs>();
  CLI::App* cmd = app.add_subcommand("encode", "Images -> token ids (.npy)");
  cmd->footer(
      "Writes an int32 .npy array of shape (images, h, w), or (images, h, w, k) for quantizers with k indices "
      "per token. Input: PNG files given with --images, or else a Fashion-MNIST split. For an image folder "
      "(--data FOLDER, or the run's own folder), -o names a directory: one WxH.npy per bucket of the run's "
      "data.buckets, and index.json with the source path of every row; `lockstep decode --tokens DIR` "
      "turns it back into a folder of PNGs.");
  cmd->add_option("checkpoint", args->checkpoint, "Checkpoint file, or a run directory holding one")->required();
  cmd->add_option("-o,--output", args->output, "The .npy file to write (a directory for an image folder)")
      ->required()
      ->check(kNonEmptyPath);
  auto* images = cmd->add_option("--images", args->images, "PNG files of one size (converted to the model's channels)")
                     ->check(CLI::ExistingFile);
  // --images names the input: a data set given beside it would be ignored, so it is refused.
  images->excludes(cmd->add_option("--data", args->data_dir,
                                   "Fashion-MNIST's directory of .gz files, or an image folder (default: the run's "
                                   "data.dir); not with --images")
                       ->check(kNonEmptyPath));
  images->excludes(cmd->add_option("--split", args->split, "Fashion-MNIST split to encode when no --images are given")
                       ->check(CLI::IsMember({"test", "train"}))
                       ->capture_default_str());
  cmd->add_option("--limit", args->limit, "Encode only the first N images (in path order for folders; 0 = all)")
      ->check(kNonNegativeInt);
  cmd->add_option("--batch-size", args->batch_size, "Images per forward pass")
      ->check(kPositiveInt)
      ->capture_default_str();
  add_threads_option(*cmd, args->threads);
  add_weight_average_option(*cmd, args->weight_average);
  cmd->callback([&run, args] { run = [args] { return run_encode(*args); }; });
}

}  // namespace lockstep::cli
