// lockstep decode: token ids (.npy) -> PNG images.
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "lockstep/core/error.h"
#include "lockstep/data/batch.h"
#include "lockstep/io/image.h"
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
};

int run_decode(const DecodeArgs& args) {
  LOCKSTEP_CHECK_ARG(!args.output_dir.empty() || !args.grid.empty(), "say where to write: --output DIR and/or --grid FILE.png");
  apply_threads(args.threads);
  train::TrainedModel t = train::load_trained_model(args.checkpoint);
  const io::RawTensor raw = io::load_npy(args.tokens);
  const at::Tensor tokens = io::from_raw(raw);
  LOCKSTEP_CHECK_ARG(!tokens.is_floating_point() && tokens.scalar_type() != torch::kBool, args.tokens,
                     ": token ids must be integers, got ", tokens.scalar_type());
  const at::Tensor ids = tokens.to(torch::kInt64);
  LOCKSTEP_CHECK_ARG(ids.dim() >= 3 && ids.size(0) > 0, args.tokens, ": expected token ids of shape (images, h, w",
                     t.model->quantizer().num_indices() > 1 ? ", k" : "", "), got ", ids.sizes());

  std::vector<io::Image> images;
  for (int64_t first = 0; first < ids.size(0); first += args.batch_size) {
    const at::Tensor part = ids.slice(0, first, std::min(first + args.batch_size, ids.size(0)));
    for (auto& img : data::tensor_to_images(t.model->decode(part))) images.push_back(std::move(img));
  }
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
  cmd->footer("Reads token ids as `lockstep encode` writes them (any integer dtype) and writes one PNG per image "
              "in --output, and/or one grid PNG with --grid.");
  cmd->add_option("checkpoint", args->checkpoint, "Checkpoint file, or a run directory holding one")->required();
  cmd->add_option("--tokens", args->tokens, "The .npy file of token ids")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", args->output_dir, "Directory for one PNG per image (000000.png, ...)");
  cmd->add_option("--grid", args->grid, "One PNG with every image in a grid, 16 per row");
  cmd->add_option("--batch-size", args->batch_size, "Images per forward pass")->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_threads_option(*cmd, args->threads);
  cmd->callback([&run, args] { run = [args] { return run_decode(*args); }; });
}

}  // namespace lockstep::cli
