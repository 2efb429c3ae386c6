#include "lockstep/train/evaluate.h"

#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/data/batch.h"

namespace lockstep::train {
namespace {
// Originals in one band of rows, reconstructions in the next, `columns` images per row.
io::Image comparison_grid(const at::Tensor& originals, const at::Tensor& reconstructions) {
  const auto a = data::tensor_to_images(originals);
  const auto b = data::tensor_to_images(reconstructions);
  const int64_t n = static_cast<int64_t>(a.size());
  const int64_t columns = std::min<int64_t>(8, n);
  std::vector<io::Image> tiles;
  for (int64_t row = 0; row * columns < n; ++row) {
    for (const auto* source : {&a, &b}) {
      for (int64_t c = 0; c < columns; ++c) {
        const int64_t i = row * columns + c;
        tiles.push_back(i < n ? (*source)[i] : io::Image{a[0].width, a[0].height, a[0].channels,
                                                       std::vector<uint8_t>(a[0].pixels.size(), 255)});
      }
    }
  }
  return io::tile_images(tiles, static_cast<int>(columns));
}

EvalResult evaluate_sets(model::AutoencoderImpl& model, const std::vector<const data::ImageSet*>& sets,
                         const EvalOptions& options) {
  LOCKSTEP_CHECK_ARG(options.batch_size_ >= 1, "eval: batch_size = ", options.batch_size_, " must be >= 1");
  int64_t images = 0, pixels = 0;
  for (const auto* set : sets) {
    images += set->count;
    pixels += set->count * set->channels * set->height * set->width;
  }
  LOCKSTEP_CHECK_ARG(images >= 1, "eval: the image set is empty");
  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;

  const int64_t k = model.quantizer().codebook_size();
  at::Tensor histogram = torch::zeros({k}, torch::kInt64);
  double squared_error = 0;
  at::Tensor grid_in, grid_out;
  for (const auto* s : sets) {
    const data::ImageSet& set = *s;
    for (int64_t first = 0; first < set.count; first += options.batch_size_) {
      const int64_t count = std::min(options.batch_size_, set.count - first);
      const at::Tensor x = data::images_to_tensor(set, first, count);
      const model::AutoencoderOutput out = model.forward(x, quant::QuantizeContext{});
      // Pixels in [0, 1]; the reconstruction is clamped as it would be when saved as an image.
      const at::Tensor diff = (out.reconstruction.clamp(-1, 1) - x) / 2;
      squared_error += diff.pow(2).sum().item<double>();
      histogram += torch::bincount(out.quant.indices.flatten(), {}, k);
      if (!grid_in.defined() && options.grid_images_ > 0) {
        const int64_t g = std::min(options.grid_images_, count);
        grid_in = x.slice(0, 0, g);
        grid_out = out.reconstruction.slice(0, 0, g);
      }
    }
  }
  if (was_training) model.train();

  EvalResult r;
  r.images = images;
  r.mse = squared_error / static_cast<double>(pixels);
  r.psnr_db = r.mse > 0 ? 10 * std::log10(1.0 / r.mse) : std::numeric_limits<double>::infinity();
  const at::Tensor p = histogram.to(torch::kFloat64) / histogram.sum().item<double>();
  r.codes_used = (histogram > 0).sum().item<int64_t>();
  r.codebook_size = k;
  r.code_usage = static_cast<double>(r.codes_used) / static_cast<double>(k);
  r.perplexity = std::exp(-(p * p.clamp_min(1e-300).log()).sum().item<double>());
  if (grid_in.defined()) r.grid = comparison_grid(grid_in, grid_out);
  return r;
}
}  // namespace

EvalResult evaluate(model::AutoencoderImpl& model, const data::ImageSet& set, const EvalOptions& options) {
  return evaluate_sets(model, {&set}, options);
}

EvalResult evaluate(model::AutoencoderImpl& model, const std::vector<data::ImageSet>& sets,
                    const EvalOptions& options) {
  std::vector<const data::ImageSet*> pointers;
  for (const auto& set : sets) pointers.push_back(&set);
  return evaluate_sets(model, pointers, options);
}

}  // namespace lockstep::train
