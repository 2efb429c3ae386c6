// Latent quantization (Hsu et al. 2023, "Disentanglement via latent quantization"), as defined in
// docs/quantizers.md section "Latent quantization" after vector-quantize-pytorch's LatentQuantize:
// each latent channel snaps to the nearest of its own few values, and the index is the mixed-radix
// number of the chosen positions. No statistics, no randomness.
#pragma once

#include <optional>
#include <vector>

#include <torch/nn/modules/linear.h>

#include "lockstep/quant/option_fields.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

struct LatentQuantizeOptions {
  explicit LatentQuantizeOptions(std::vector<int64_t> levels) : levels_(std::move(levels)) {}

  int64_t codebook_dim() const { return static_cast<int64_t>(levels_.size()); }
  // Channels of the input; linear projections (with bias) in and out when it differs from
  // len(levels) x num_codebooks. Unset means no projection.
  int64_t dim() const { return dim_.value_or(codebook_dim() * num_codebooks_); }
  int64_t codebook_size() const;  // the product of the levels

  // Every option: latent_options.def, one line each (option_fields.h).
#define LOCKSTEP_OPTIONS LatentQuantizeOptions
#define LOCKSTEP_OPTIONS_FIELDS "lockstep/quant/latent_options.def"
#include "lockstep/quant/option_fields.inc"

  // Throws InvalidArgument with the value: a field outside its limits, no levels, a level < 2, a
  // product above 2^31, dim < 1.
  void validate() const;
};

class LatentQuantize final : public Quantizer {
 public:
  // Projections, when needed, are initialised as torch.nn.Linear's from torch's default generator
  // (in, then out, as the reference). The values of a level L: linspace(-0.5, 0.5, L) when L is odd,
  // arange(L) / L - 0.5 when even (zero always among them), buffers `values_per_latent.<i>`.
  explicit LatentQuantize(LatentQuantizeOptions options);

  std::string kind() const override { return "latent"; }
  int64_t dim() const override { return options_.dim(); }
  int64_t codebook_size() const override { return options_.codebook_size(); }
  int64_t num_indices() const override { return options_.num_codebooks(); }

  // Straight-through: the output's value is the chosen values (projected out), its gradient the
  // input's. Losses (training only, those with a weight > 0): "commitment", "quantization".
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  at::Tensor encode(const at::Tensor& x) override;
  at::Tensor decode(const at::Tensor& indices) override;

  const LatentQuantizeOptions& options() const { return options_; }

 private:
  // (b, n, dim) -> latents (b, n, C, cd), projected in.
  at::Tensor latents(const at::Tensor& x);
  // Latents (b, n, C, cd) -> each channel's chosen position (b, n, C, cd), int64.
  at::Tensor positions(const at::Tensor& z) const;
  at::Tensor values_at(const at::Tensor& positions) const;   // -> (b, n, C, cd)
  at::Tensor indices_of(const at::Tensor& positions) const;  // -> (b, n, C)
  at::Tensor output_of(const at::Tensor& codes) const;       // (b, n, C, cd) -> (b, n, dim), projected out

  LatentQuantizeOptions options_;
  std::vector<at::Tensor> values_;  // buffers, one per latent channel
  torch::nn::Linear project_in_{nullptr};
  torch::nn::Linear project_out_{nullptr};
};

}  // namespace lockstep::quant
