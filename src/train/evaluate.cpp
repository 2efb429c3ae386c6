#include "lockstep/train/evaluate.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/data/batch.h"
#include "lockstep/train/fid.h"
#include "lockstep/train/ssim.h"

namespace lockstep::train {
namespace {
// Tiles at least this many pixels on their shorter side, so that a 28x28 image can be looked at.
constexpr int64_t kMinTileSide = 96;
constexpr int64_t kMostTileScale = 8;
// Images per call of LPIPS or Inception, whose activations are large whatever the batch size.
constexpr int64_t kNetworkChunk = 16;

// Each pixel as a factor x factor block (nearest neighbour: the pixels stay visible as they are).
io::Image scaled_up(const io::Image& in, int64_t factor) {
  if (factor <= 1) return in;
  io::Image out{static_cast<int>(in.width * factor), static_cast<int>(in.height * factor), in.channels, {}};
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * out.channels);
  for (int64_t y = 0; y < out.height; ++y) {
    for (int64_t x = 0; x < out.width; ++x) {
      const size_t from = static_cast<size_t>(((y / factor) * in.width + x / factor) * in.channels);
      const size_t to = static_cast<size_t>((y * out.width + x) * out.channels);
      for (int c = 0; c < in.channels; ++c) out.pixels[to + c] = in.pixels[from + c];
    }
  }
  return out;
}

// Originals in one band of rows, reconstructions in the next, `columns` images per row, each scaled
// up by a whole factor when small.
io::Image comparison_grid(const at::Tensor& originals, const at::Tensor& reconstructions) {
  auto a = data::tensor_to_images(originals);
  auto b = data::tensor_to_images(reconstructions);
  const int64_t side = std::min(a[0].width, a[0].height);
  const int64_t factor = std::clamp<int64_t>((kMinTileSide + side - 1) / side, 1, kMostTileScale);
  for (auto* images : {&a, &b}) {
    for (auto& image : *images) image = scaled_up(image, factor);
  }
  const int64_t n = static_cast<int64_t>(a.size());
  const int64_t columns = std::min<int64_t>(8, n);
  std::vector<io::Image> tiles;
  for (int64_t row = 0; row * columns < n; ++row) {
    for (const auto* source : {&a, &b}) {
      for (int64_t c = 0; c < columns; ++c) {
        const int64_t i = row * columns + c;
        tiles.push_back(
            i < n ? (*source)[i]
                  : io::Image{a[0].width, a[0].height, a[0].channels, std::vector<uint8_t>(a[0].pixels.size(), 255)});
      }
    }
  }
  return io::tile_images(tiles, static_cast<int>(columns));
}

}  // namespace

struct Evaluation::State {
  model::AutoencoderImpl& model;
  EvalOptions options;
  bool was_training = false;
  at::Tensor histogram;
  double squared_error = 0, ssim_sum = 0, lpips_sum = 0;
  FeatureStatistics fid_real, fid_reconstructed;
  int64_t images = 0, values = 0;
  at::Tensor grid_in, grid_out;
  at::Device device{at::kCPU};  // the model's: images go there, results come back to the host
  State(model::AutoencoderImpl& m, const EvalOptions& o) : model(m), options(o) {
    const auto params = m.parameters();
    if (!params.empty()) device = params.front().device();
  }
};

Evaluation::Evaluation(model::AutoencoderImpl& model, const EvalOptions& options)
    : s_(std::make_unique<State>(model, options)) {
  LOCKSTEP_CHECK_ARG(options.batch_size_ >= 1, "eval: batch_size = ", options.batch_size_, " must be >= 1");
  s_->was_training = model.is_training();
  model.eval();
  s_->histogram = torch::zeros({model.quantizer().codebook_size()}, torch::kInt64);
}

Evaluation::~Evaluation() {
  if (s_->was_training) s_->model.train();
}

void Evaluation::add(const at::Tensor& images) {
  torch::NoGradGuard no_grad;  // scoped here: grad mode is per thread
  State& s = *s_;
  const int64_t k = s.histogram.size(0);
  for (int64_t first = 0; first < images.size(0); first += s.options.batch_size_) {
    const at::Tensor x = images.slice(0, first, std::min(first + s.options.batch_size_, images.size(0))).to(s.device);
    const model::AutoencoderOutput out = s.model.forward(x, quant::QuantizeContext{});
    // Finite weights can still overflow float32 on the way: no figure (or code histogram) means anything then.
    LOCKSTEP_THROW_IF_NOT(out.reconstruction.isfinite().all().item<bool>(), CorruptInput,
                          "the model's reconstructions are not finite: its weights overflow float32 or hold nan, "
                          "so there is nothing to evaluate");
    // Pixels in [0, 1]; the reconstruction is clamped as it would be when saved as an image.
    const at::Tensor reconstruction = out.reconstruction.clamp(-1, 1);
    const at::Tensor diff = (reconstruction - x) / 2;
    s.squared_error += diff.pow(2).sum().item<double>();
    s.ssim_sum += ssim_per_image((x + 1) / 2, (reconstruction + 1) / 2).sum().item<double>();
    if (s.options.fid_) {  // Inception runs at 299x299 whatever the images' size: a few at a time
      for (int64_t i = 0; i < x.size(0); i += kNetworkChunk) {
        const int64_t n = std::min(kNetworkChunk, x.size(0) - i);
        s.fid_real.add(s.options.fid_->features(x.narrow(0, i, n)));
        s.fid_reconstructed.add(s.options.fid_->features(reconstruction.narrow(0, i, n)));
      }
    }
    if (s.options.lpips_) {  // a few images at a time: VGG16's activations are 64 channels at full size
      for (int64_t i = 0; i < x.size(0); i += kNetworkChunk) {
        const int64_t n = std::min(kNetworkChunk, x.size(0) - i);
        s.lpips_sum +=
            s.options.lpips_->forward(reconstruction.narrow(0, i, n), x.narrow(0, i, n)).sum().item<double>();
      }
    }
    s.values += x.numel();
    s.images += x.size(0);
    s.histogram += torch::bincount(out.quant.indices.flatten(), {}, k).cpu();
    if (!s.grid_in.defined() && s.options.grid_images_ > 0) {
      const int64_t g = std::min(s.options.grid_images_, x.size(0));
      s.grid_in = x.slice(0, 0, g).cpu();
      s.grid_out = out.reconstruction.slice(0, 0, g).cpu();
    }
  }
}

EvalResult Evaluation::result() const {
  const State& s = *s_;
  LOCKSTEP_CHECK_ARG(s.images >= 1, "eval: the image set is empty");
  EvalResult r;
  r.images = s.images;
  r.mse = s.squared_error / static_cast<double>(s.values);
  r.psnr_db = r.mse > 0 ? 10 * std::log10(1.0 / r.mse) : std::numeric_limits<double>::infinity();
  r.ssim = s.ssim_sum / static_cast<double>(s.images);
  if (s.options.lpips_) r.lpips = s.lpips_sum / static_cast<double>(s.images);
  if (s.options.fid_ && s.images >= 2) {
    r.fid = frechet_distance(s.fid_real.mean(), s.fid_real.covariance(), s.fid_reconstructed.mean(),
                             s.fid_reconstructed.covariance());
  }
  const at::Tensor p = s.histogram.to(torch::kFloat64) / s.histogram.sum().item<double>();
  r.codes_used = (s.histogram > 0).sum().item<int64_t>();
  r.codebook_size = s.histogram.size(0);
  r.code_usage = static_cast<double>(r.codes_used) / static_cast<double>(r.codebook_size);
  r.perplexity = std::exp(-(p * p.clamp_min(1e-300).log()).sum().item<double>());
  if (s.grid_in.defined()) r.grid = comparison_grid(s.grid_in, s.grid_out);
  return r;
}

namespace {
// Converted one batch at a time: a whole test set as float would be 4x its bytes.
void add_set(Evaluation& e, const data::ImageSet& set, const EvalOptions& options) {
  const int64_t batch = options.batch_size_;
  for (int64_t first = 0; first < set.count; first += batch) {
    if (options.stop_requested_ && options.stop_requested_->load()) {
      throw EvaluationStopped(
          detail::concat("evaluation stopped on request after ", first, " of ", set.count, " images"));
    }
    e.add(data::images_to_tensor(set, first, std::min(batch, set.count - first)));
  }
}
}  // namespace

EvalResult evaluate(model::AutoencoderImpl& model, const data::ImageSet& set, const EvalOptions& options) {
  Evaluation e(model, options);
  add_set(e, set, options);
  return e.result();
}

EvalResult evaluate(model::AutoencoderImpl& model, const std::vector<data::ImageSet>& sets,
                    const EvalOptions& options) {
  Evaluation e(model, options);
  for (const auto& set : sets) add_set(e, set, options);
  return e.result();
}

}  // namespace lockstep::train
