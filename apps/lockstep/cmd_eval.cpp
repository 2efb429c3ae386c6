// lockstep eval: reconstruction error and code usage of a trained tokenizer on a data split.
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "folder_input.h"
#include "lockstep/data/batch.h"
#include "lockstep/io/image.h"
#include "lockstep/train/fid.h"
#include "lockstep/train/lpips_weights.h"
#include "lockstep/train/model_factory.h"

namespace lockstep::cli {
namespace {

struct EvalArgs {
  std::string checkpoint;
  std::string data_dir;
  std::string split = "test";
  int64_t limit = 0;
  int64_t batch_size = 500;
  std::string grid;
  int threads = 0;
  bool weight_average = false;
  std::string lpips;  // LPIPS-VGG weights; empty: the run's loss.lpips_weights, when set
  std::string fid;    // FID Inception weights; empty: the run's eval.fid_weights, when set
};

int run_eval(const EvalArgs& args) {
  apply_threads(args.threads);
  train::TrainedModel t = train::load_trained_model(args.checkpoint, args.weight_average);
  const bool folder_run = t.settings.data.dataset() == "folder";
  const std::string dir = args.data_dir.empty() ? t.settings.data.dir() : args.data_dir;
  train::EvalOptions options = train::EvalOptions().batch_size(args.batch_size).grid_images(args.grid.empty() ? 0 : 16);
  const std::string lpips_path = args.lpips.empty() ? t.settings.loss.lpips_weights() : args.lpips;
  if (!lpips_path.empty()) {
    model::Lpips lpips = train::load_lpips(lpips_path, args.lpips.empty() ? "the run's loss.lpips_weights" : "--lpips");
    lpips->to(t.model->parameters().front().device());
    options.lpips(lpips.ptr());
  }
  const std::string fid_path = args.fid.empty() ? t.settings.eval.fid_weights() : args.fid;
  if (!fid_path.empty()) {
    model::FidInception fid =
        train::load_fid_inception(fid_path, args.fid.empty() ? "the run's eval.fid_weights" : "--fid");
    fid->to(t.model->parameters().front().device());
    options.fid(fid.ptr());
  }
  train::EvalResult r;
  std::string what;
  if ((args.data_dir.empty() && folder_run) || (!args.data_dir.empty() && is_image_folder(dir))) {
    // The run's own folder: its held-out (test) or training images; another folder: all of it.
    const FolderSelection selection = !args.data_dir.empty() ? FolderSelection::All
                                      : args.split == "test" ? FolderSelection::HeldOut
                                                             : FolderSelection::Training;
    const FolderInput input = open_folder_input(t, args.checkpoint, dir, selection, args.limit);
    train::Evaluation e(*t.model, options);
    for_each_batch(input, static_cast<int>(t.model->options().in_channels()), args.batch_size,
                   [&](size_t, const std::vector<int64_t>&, const at::Tensor& x) { e.add(x); });
    r = e.result();
    what = selection == FolderSelection::All
               ? "image folder " + dir
               : "image folder " + dir + ", " + (selection == FolderSelection::HeldOut ? "held-out" : "training") +
                     " images";
  } else {
    const data::ImageSet set = data::first_images(
        data::load_fashion_mnist(dir, args.split == "train" ? data::Split::Train : data::Split::Test), args.limit);
    r = train::evaluate(*t.model, set, options);
    what = "Fashion-MNIST " + args.split + " split";
  }
  std::cout << "checkpoint " << t.checkpoint << " (step " << t.step << "), " << what << ", " << r.images << " images\n"
            << format_eval(r) << "\n";
  if (!args.grid.empty()) {
    io::save_png(args.grid, r.grid);
    std::cout << "wrote " << args.grid << "\n";
  }
  return kExitOk;
}

}  // namespace

void add_eval_command(CLI::App& app, Runner& run) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Measure a trained tokenizer on Fashion-MNIST or an image folder");
  cmd->footer(
      "Prints the MSE and PSNR of the reconstructions (pixels in [0, 1]), the fraction of codes used, and the "
      "perplexity of the code histogram, the mean SSIM, and the mean LPIPS distance when LPIPS weights are "
      "given (--lpips, or the run's loss.lpips_weights), and rFID (the images against their reconstructions) when "
      "Inception weights are given (--fid, or the run's eval.fid_weights). A run trained on an image folder is "
      "measured on its held-out "
      "images (--split test) or its training images (--split train); --data FOLDER measures every image "
      "of another folder, each fitted to the run's buckets.");
  cmd->add_option("checkpoint", args->checkpoint, "Checkpoint file, or a run directory holding one")->required();
  cmd->add_option("--data", args->data_dir,
                  "Fashion-MNIST's directory of .gz files, or an image folder (default: the run's data.dir)");
  cmd->add_option("--split", args->split, "Which split to evaluate")
      ->check(CLI::IsMember({"test", "train"}))
      ->capture_default_str();
  cmd->add_option("--limit", args->limit, "Evaluate only the first N images (in path order for folders; 0 = all)")
      ->check(kNonNegativeInt);
  cmd->add_option("--batch-size", args->batch_size, "Images per forward pass")
      ->check(kPositiveInt)
      ->capture_default_str();
  cmd->add_option("--grid", args->grid, "Also write a PNG of 16 images above their reconstructions")
      ->check(kNonEmptyPath);
  cmd->add_option("--lpips", args->lpips,
                  "LPIPS-VGG weights (a safetensors file, docs/losses.md) for an LPIPS figure (default: the run's "
                  "loss.lpips_weights)");
  cmd->add_option("--fid", args->fid,
                  "pytorch-fid's Inception weights (a safetensors file, docs/losses.md) for an rFID figure (default: "
                  "the run's eval.fid_weights)");
  add_threads_option(*cmd, args->threads);
  add_weight_average_option(*cmd, args->weight_average);
  cmd->callback([&run, args] { run = [args] { return run_eval(*args); }; });
}

}  // namespace lockstep::cli
