// lockstep decode: token ids (.npy) -> PNG images.
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "folder_input.h"
#include "lockstep/core/error.h"
#include "lockstep/data/batch.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/io/image.h"
#include "lockstep/io/json_error.h"
#include "lockstep/io/nesting.h"
#include "lockstep/io/npy.h"
#include "lockstep/io/tensor_convert.h"
#include "lockstep/train/model_factory.h"

namespace lockstep::cli {
namespace {

struct DecodeArgs {
  std::string checkpoint;
  std::string tokens;
  std::string output_dir;
  std::string grid;
  int64_t batch_size = 500;
  int threads = 0;
  bool weight_average = false;
};

// Token ids from a .npy file, checked to be integers of shape (images, h, w[, k]).
at::Tensor load_token_ids(const std::string& path, train::TrainedModel& t) {
  const at::Tensor tokens = io::from_raw(io::load_npy(path));
  LOCKSTEP_CHECK_ARG(!tokens.is_floating_point() && tokens.scalar_type() != torch::kBool, path,
                     ": token ids must be integers, got ", tokens.scalar_type());
  const at::Tensor ids = tokens.to(torch::kInt64);
  LOCKSTEP_CHECK_ARG(ids.dim() >= 3 && ids.numel() > 0, path, ": expected token ids of shape (images, h, w",
                     t.model->quantizer().num_indices() > 1 ? ", k" : "", ") with no side of length 0, got ",
                     ids.sizes());
  // Named here with the file, the value and where it is: the quantizer alone knows none of these.
  const int64_t codes = t.model->quantizer().codebook_size();
  const at::Tensor bad = ((ids < 0) | (ids >= codes)).reshape(-1).nonzero();
  if (bad.numel() > 0) {
    const int64_t flat = bad[0][0].item<int64_t>();
    std::vector<int64_t> where;
    int64_t rest = flat;
    for (int64_t d = ids.dim() - 1; d >= 0; --d) {
      where.insert(where.begin(), rest % ids.size(d));
      rest /= ids.size(d);
    }
    throw InvalidArgument(detail::concat(path, ": token id ", ids.reshape(-1)[flat].item<int64_t>(), " at ",
                                         c10::IntArrayRef(where), " is outside [0, ", codes, ") (", bad.size(0),
                                         " of the ", ids.numel(), " ids are)"));
  }
  return ids;
}

std::vector<io::Image> decode_all(const at::Tensor& ids, train::TrainedModel& t, int64_t batch_size) {
  std::vector<io::Image> images;
  const int64_t f = t.model->options().downsampling();
  check_forward_fits(*t.model, std::min(batch_size, ids.size(0)), ids.size(2) * f, ids.size(1) * f);
  for (int64_t first = 0; first < ids.size(0); first += batch_size) {
    const at::Tensor part = ids.slice(0, first, std::min(first + batch_size, ids.size(0)));
    for (auto& img : data::tensor_to_images(t.model->decode(part))) images.push_back(std::move(img));
  }
  return images;
}

// The directory `encode` wrote for a folder: every row back to a PNG at its source's path.
int decode_folder(const DecodeArgs& args, train::TrainedModel& t) {
  namespace fs = std::filesystem;
  LOCKSTEP_CHECK_ARG(!args.output_dir.empty() && args.grid.empty(), args.tokens, " holds the tokens of an image ",
                     "folder (one .npy per bucket): say where to write the images with --output DIR (--grid takes one "
                     ".npy file)");
  const std::string index_path = (fs::path(args.tokens) / kTokenIndexFile).string();
  int64_t written = 0;
  std::set<std::string> outputs;
  try {
    const std::string index_text = io::read_file(index_path);
    io::check_nesting(io::json_nesting_depth(index_text), io::kMaxJsonNesting, index_path);
    const nlohmann::json index = nlohmann::json::parse(index_text);
    LOCKSTEP_THROW_IF_NOT(index.at("format") == kTokenIndexFormat, CorruptInput, index_path, ": format ",
                          index.at("format").dump(), ", expected \"", kTokenIndexFormat, "\"");
    std::set<std::string> sources;  // every image once: a second one of a path would overwrite the first
    for (const auto& bucket : index.at("buckets")) {
      const std::string file = (fs::path(args.tokens) / bucket.at("file").get<std::string>()).string();
      const auto& paths = bucket.at("paths");
      const at::Tensor ids = load_token_ids(file, t);
      LOCKSTEP_THROW_IF_NOT(ids.size(0) == static_cast<int64_t>(paths.size()), CorruptInput, file, " holds ",
                            ids.size(0), " images but ", index_path, " names ", paths.size());
      const std::vector<io::Image> images = decode_all(ids, t, args.batch_size);
      for (size_t i = 0; i < images.size(); ++i) {
        const fs::path source = paths[i].get<std::string>();
        LOCKSTEP_THROW_IF_NOT(source.is_relative() && source.lexically_normal().string().rfind("..", 0) != 0,
                              CorruptInput, index_path, ": path ", source, " leads outside the output directory");
        const fs::path name = source.lexically_normal().filename();
        LOCKSTEP_THROW_IF_NOT(!name.empty() && name != "." && name != "..", CorruptInput, index_path, ": path ", source,
                              " names no file");
        LOCKSTEP_THROW_IF_NOT(sources.insert(source.lexically_normal().string()).second, CorruptInput, index_path,
                              ": path ", source, " is listed twice");
        // a.jpg -> a.png, unless a.png (or another a.*) came first: then a.jpg.png.
        fs::path out = fs::path(args.output_dir) / paths[i].get<std::string>();
        out.replace_extension(".png");
        if (!outputs.insert(out.string()).second)
          out = fs::path(args.output_dir) / (paths[i].get<std::string>() + ".png");
        fs::create_directories(out.parent_path());
        io::save_png(out.string(), images[i]);
        ++written;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptInput(
        detail::concat(index_path, ": not an index written by lockstep encode: ", io::json_error_text(e)));
  }
  std::cout << "wrote " << written << " PNG images to " << args.output_dir << " (at their source paths)\n";
  return kExitOk;
}

int run_decode(const DecodeArgs& args) {
  LOCKSTEP_CHECK_USAGE(!args.output_dir.empty() || !args.grid.empty(),
                       "say where to write: --output DIR and/or --grid FILE.png");
  apply_threads(args.threads);
  train::TrainedModel t = train::load_trained_model(args.checkpoint, args.weight_average);
  if (std::filesystem::is_directory(args.tokens)) return decode_folder(args, t);
  const std::vector<io::Image> images = decode_all(load_token_ids(args.tokens, t), t, args.batch_size);
  if (!args.output_dir.empty()) {
    std::filesystem::create_directories(args.output_dir);
    for (size_t i = 0; i < images.size(); ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "%06zu.png", i);
      io::save_png((std::filesystem::path(args.output_dir) / name).string(), images[i]);
    }
    std::cout << "wrote " << images.size() << " PNG images to " << args.output_dir << "\n";
  }
  if (!args.grid.empty()) {
    io::save_png(args.grid, io::tile_images(images, static_cast<int>(std::min<size_t>(16, images.size()))));
    std::cout << "wrote a grid of " << images.size() << " images to " << args.grid << "\n";
  }
  return kExitOk;
}

}  // namespace

void add_decode_command(CLI::App& app, Runner& run) {
  auto args = std::make_shared<DecodeArgs>();
  CLI::App* cmd = app.add_subcommand("decode", "Token ids (.npy) -> PNG images");
  cmd->footer(
      "Reads token ids as `lockstep encode` writes them (any integer dtype) and writes one PNG per image "
      "in --output, and/or one grid PNG with --grid. Given the directory `encode` wrote for an image folder, "
      "writes every image to --output at its source's path (as .png).");
  cmd->add_option("checkpoint", args->checkpoint, "Checkpoint file, or a run directory holding one")->required();
  cmd->add_option("--tokens", args->tokens, "The .npy file of token ids, or the directory encode wrote for a folder")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("-o,--output", args->output_dir, "Directory for one PNG per image (000000.png, ...)")
      ->check(kNonEmptyPath);
  cmd->add_option("--grid", args->grid, "One PNG with every image in a grid, 16 per row")->check(kNonEmptyPath);
  cmd->add_option("--batch-size", args->batch_size, "Images per forward pass")
      ->check(kPositiveInt)
      ->capture_default_str();
  add_threads_option(*cmd, args->threads);
  add_weight_average_option(*cmd, args->weight_average);
  cmd->callback([&run, args] { run = [args] { return run_decode(*args); }; });
}

}  // namespace lockstep::cli
