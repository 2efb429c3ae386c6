// Test-set evaluation of an autoencoder: reconstruction error and how the codebook is used.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/data/image_set.h"
#include "lockstep/io/image.h"
#include "lockstep/model/autoencoder.h"
#include "lockstep/model/inception.h"
#include "lockstep/model/lpips.h"

namespace lockstep::train {

struct EvalOptions {
  EvalOptions& batch_size(int64_t n) {
    batch_size_ = n;
    return *this;
  }
  EvalOptions& grid_images(int64_t n) {
    grid_images_ = n;
    return *this;
  }
  // Adds the mean LPIPS distance to the result (loss.lpips_weights).
  EvalOptions& lpips(std::shared_ptr<model::LpipsImpl> network) {
    lpips_ = std::move(network);
    return *this;
  }
  // Adds rFID (the images against their reconstructions) to the result (eval.fid_weights).
  EvalOptions& fid(std::shared_ptr<model::FidInceptionImpl> network) {
    fid_ = std::move(network);
    return *this;
  }
  // Checked before each batch: once set, evaluate() stops with EvaluationStopped (Ctrl-C).
  EvalOptions& stop_requested(const std::atomic<bool>* flag) {
    stop_requested_ = flag;
    return *this;
  }
  int64_t batch_size_ = 500;
  int64_t grid_images_ = 16;
  std::shared_ptr<model::LpipsImpl> lpips_;
  std::shared_ptr<model::FidInceptionImpl> fid_;
  const std::atomic<bool>* stop_requested_ = nullptr;  // the first N images and their reconstructions, for a PNG grid
};

// evaluate() was asked to stop (EvalOptions::stop_requested) before it had seen every image.
class EvaluationStopped : public Error {
 public:
  using Error::Error;
};

struct EvalResult {
  int64_t images = 0;
  double mse = 0;               // mean squared error per pixel, pixels scaled to [0, 1]
  double psnr_db = 0;           // 10 log10(1 / mse)
  double ssim = 0;              // mean structural similarity per image (train/ssim.h)
  std::optional<double> lpips;  // mean LPIPS distance per image, when EvalOptions::lpips was given
  std::optional<double> fid;    // rFID over the whole set, when EvalOptions::fid was given (2+ images)
  double code_usage = 0;        // fraction of the codebook's codes used at least once
  double perplexity = 0;        // exp(entropy of the code histogram)
  int64_t codes_used = 0;
  int64_t codebook_size = 0;
  bool weight_average = false;  // the trainer's: whether the weights' moving average was evaluated
  io::Image grid;               // originals above their reconstructions, grid_images of each
};

// An evaluation fed batch by batch (batches may differ in size, e.g. one bucket after another):
// the model runs in evaluation mode until the Evaluation is destroyed, add() without gradients.
class Evaluation {
 public:
  Evaluation(model::AutoencoderImpl& model, const EvalOptions& options);
  ~Evaluation();  // restores the model's training mode
  Evaluation(const Evaluation&) = delete;
  Evaluation& operator=(const Evaluation&) = delete;

  // x: (b, c, h, w) in [-1, 1]. Splits it into batches of options.batch_size_.
  void add(const at::Tensor& x);
  EvalResult result() const;  // throws InvalidArgument when nothing was added

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Runs `model` in evaluation mode (restoring its mode after) on every image of `set`.
EvalResult evaluate(model::AutoencoderImpl& model, const data::ImageSet& set, const EvalOptions& options);
// The same over several sets (one per image size, e.g. per bucket), as if they were one: errors and
// the code histogram are pooled over every pixel and token; the grid shows the first set's images.
EvalResult evaluate(model::AutoencoderImpl& model, const std::vector<data::ImageSet>& sets, const EvalOptions& options);

}  // namespace lockstep::train
