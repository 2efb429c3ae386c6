// lockstep decode: token ids (.npy) -> PNG images.
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
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
#include "progress.h"

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

// Progress of a long decode on stderr, a line every few seconds, and the rate at the end.
class DecodeProgress {
 public:
  explicit DecodeProgress(int64_t total) : total_(total), start_(Clock::now()), last_(start_) {}

  void done(int64_t images) {
    done_ += images;
    const auto now = Clock::now();
    if (done_ < total_ && now - last_ >= std::chrono::seconds(3)) {
      last_ = now;
      const double rate = per_second();
      std::cerr << "decoded " << done_ << " of " << total_ << " images (" << static_cast<int64_t>(rate) << " images/s, "
                << format_duration(static_cast<double>(total_ - done_) / rate) << " left)\n";
    }
  }
  double per_second() const {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    return static_cast<double>(done_) / std::max(seconds, 1e-9);
  }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_;
  int64_t done_ = 0;
  Clock::time_point start_, last_;
};

// Decodes `ids` a batch at a time (memory of one batch of images, whatever their number) and hands
// each batch, with the index of its first image, to `take`.
void decode_batches(const at::Tensor& ids, train::TrainedModel& t, int64_t batch_size,
                    const std::function<void(int64_t, std::vector<io::Image>&)>& take) {
  const int64_t f = t.model->options().downsampling();
  check_forward_fits(*t.model, std::min(batch_size, ids.size(0)), ids.size(2) * f, ids.size(1) * f);
  for (int64_t first = 0; first < ids.size(0); first += batch_size) {
    const at::Tensor part = ids.slice(0, first, std::min(first + batch_size, ids.size(0)));
    std::vector<io::Image> images = data::tensor_to_images(t.model->decode(part));
    take(first, images);
  }
}

// One batch of PNG files: encoded on every intra-op thread, then written with one flush to disk for
// all (io::write_files_atomic), each still atomic.
void write_pngs(const std::vector<std::string>& paths, const std::vector<io::Image>& images) {
  std::vector<std::pair<std::string, std::string>> files(images.size());
  at::parallel_for(0, static_cast<int64_t>(images.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) files[i] = {paths[i], io::encode_png(images[i], paths[i])};
  });
  io::write_files_atomic(files);
}

std::string rate_text(const DecodeProgress& progress) {
  return detail::concat(static_cast<int64_t>(progress.per_second()), " images/s");
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
    int64_t total = 0;
    for (const auto& bucket : index.at("buckets")) total += static_cast<int64_t>(bucket.at("paths").size());
    DecodeProgress progress(total);
    for (const auto& bucket : index.at("buckets")) {
      const std::string file = (fs::path(args.tokens) / bucket.at("file").get<std::string>()).string();
      const auto& paths = bucket.at("paths");
      const at::Tensor ids = load_token_ids(file, t);
      LOCKSTEP_THROW_IF_NOT(ids.size(0) == static_cast<int64_t>(paths.size()), CorruptInput, file, " holds ",
                            ids.size(0), " images but ", index_path, " names ", paths.size());
      // Every output path of the bucket checked before anything of it is decoded or written.
      std::vector<std::string> out_paths;
      for (const auto& entry : paths) {
        const fs::path source = entry.get<std::string>();
        LOCKSTEP_THROW_IF_NOT(source.is_relative() && source.lexically_normal().string().rfind("..", 0) != 0,
                              CorruptInput, index_path, ": path ", source, " leads outside the output directory");
        const fs::path name = source.lexically_normal().filename();
        LOCKSTEP_THROW_IF_NOT(!name.empty() && name != "." && name != "..", CorruptInput, index_path, ": path ", source,
                              " names no file");
        LOCKSTEP_THROW_IF_NOT(sources.insert(source.lexically_normal().string()).second, CorruptInput, index_path,
                              ": path ", source, " is listed twice");
        // a.jpg -> a.png, unless a.png (or another a.*) came first: then a.jpg.png.
        fs::path out = fs::path(args.output_dir) / entry.get<std::string>();
        out.replace_extension(".png");
        if (!outputs.insert(out.string()).second) out = fs::path(args.output_dir) / (entry.get<std::string>() + ".png");
        out_paths.push_back(out.string());
      }
      decode_batches(ids, t, args.batch_size, [&](int64_t first, std::vector<io::Image>& images) {
        const std::vector<std::string> batch_paths(out_paths.begin() + first,
                                                   out_paths.begin() + first + static_cast<int64_t>(images.size()));
        for (const auto& path : batch_paths) {
          // A folder inside --output that is a link would take the images elsewhere: refused, as a link at
          // the file itself is.
          fs::path below = args.output_dir;
          for (const auto& part : fs::path(path).parent_path().lexically_relative(args.output_dir)) {
            below /= part;
            LOCKSTEP_THROW_IF_NOT(!fs::is_symlink(below), IoError, "cannot write ", path, ": ", below.string(),
                                  " is a symbolic link; lockstep does not write through links (remove it)");
          }
          fs::create_directories(fs::path(path).parent_path());
        }
        write_pngs(batch_paths, images);
        written += static_cast<int64_t>(images.size());
        progress.done(static_cast<int64_t>(images.size()));
      });
    }
    std::cout << "wrote " << written << " PNG images to " << args.output_dir << " (at their source paths; "
              << rate_text(progress) << ")\n";
  } catch (const nlohmann::json::exception& e) {
    throw CorruptInput(
        detail::concat(index_path, ": not an index written by lockstep encode: ", io::json_error_text(e)));
  }
  return kExitOk;
}

int run_decode(const DecodeArgs& args) {
  LOCKSTEP_CHECK_USAGE(!args.output_dir.empty() || !args.grid.empty(),
                       "say where to write: --output DIR and/or --grid FILE.png");
  apply_threads(args.threads);
  train::TrainedModel t = train::load_trained_model(args.checkpoint, args.weight_average);
  if (std::filesystem::is_directory(args.tokens)) return decode_folder(args, t);
  const at::Tensor ids = load_token_ids(args.tokens, t);
  if (!args.output_dir.empty()) std::filesystem::create_directories(args.output_dir);
  std::vector<io::Image> grid_images;  // kept only for --grid
  DecodeProgress progress(ids.size(0));
  decode_batches(ids, t, args.batch_size, [&](int64_t first, std::vector<io::Image>& images) {
    if (!args.output_dir.empty()) {
      std::vector<std::string> paths;
      for (size_t i = 0; i < images.size(); ++i) {
        char name[32];
        std::snprintf(name, sizeof name, "%06lld.png", static_cast<long long>(first + static_cast<int64_t>(i)));
        paths.push_back((std::filesystem::path(args.output_dir) / name).string());
      }
      write_pngs(paths, images);
    }
    if (!args.grid.empty()) {
      for (auto& image : images) grid_images.push_back(std::move(image));
    }
    progress.done(static_cast<int64_t>(images.size()));
  });
  if (!args.output_dir.empty()) {
    std::cout << "wrote " << ids.size(0) << " PNG images to " << args.output_dir << " (" << rate_text(progress)
              << ")\n";
  }
  if (!args.grid.empty()) {
    io::save_png(args.grid, io::tile_images(grid_images, static_cast<int>(std::min<size_t>(16, grid_images.size()))));
    std::cout << "wrote a grid of " << grid_images.size() << " images to " << args.grid << "\n";
  }
  return kExitOk;
}

}  // namespace

void add_decode_command(CLI::App& app, Runner& run) {
  auto args = std::make_shared<DecodeArgs>();
  CLI::App* cmd = app.add_subcommand("decode", "Token ids (.npy) -> PNG images");
  cmd->footer(
      "Reads token ids as `lockstep encode` writes them (int8, int16, int32, int64 or uint8; convert numpy's "
      "uint16/32/64 with astype) and writes one PNG per image "
      "in --output, and/or one grid PNG with --grid. Given the directory `encode` wrote for an image folder, "
      "writes every image to --output at its source's path (as .png). Works a batch at a time (memory of "
      "one batch), says how far it got on stderr every few seconds, and gives the rate at the end.");
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
