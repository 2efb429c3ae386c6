// Finite scalar perturbation (FSP, arXiv 2602.17133), as vector-quantize-pytorch's FSP defines it:
// each latent channel is mapped into [0, 1] by a CDF activation and snapped to the midpoint of one
// of `levels` equal bins (straight-through); in training, a share of the channels instead takes
// the activation moved by uniform noise within half a bin. A regulariser pulls the batch's mean,
// variance, skewness and kurtosis of each channel towards targets (docs/quantizers.md).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/modules/linear.h>

#include "lockstep/quant/option_fields.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

// The CDF that maps a channel into [0, 1] (its inverse maps a bin back with need_inv_act).
enum class FspActivation { Tanh, Sigmoid, Normal, Laplace, Cauchy };
const std::vector<std::string>& choice_names(FspActivation);  // "tanh", "sigmoid", ...: the key's values
FspActivation fsp_activation(const std::string& name);        // InvalidArgument listing the names
std::string fsp_activation_name(FspActivation activation);
// The CDF, elementwise: (-inf, inf) -> [0, 1]; differentiable. The reference's build_cdf_act pair.
at::Tensor fsp_activate(FspActivation activation, const at::Tensor& z);
// Its inverse, elementwise: (0, 1) -> (-inf, inf); differentiable.
at::Tensor fsp_invert(FspActivation activation, const at::Tensor& p);

// The regulariser's targets and weights, for mean, variance, skewness and excess kurtosis in that
// order: sum_k weight_k * mean over channels of (statistic_k - target_k)^2.
// The reference's presets of it (the key `vector_norm`).
enum class FspNormPreset { None, Var, Kurt, VarTanh, VarSigmoid, VarLaplace };
const std::vector<std::string>& choice_names(FspNormPreset);  // "none", "var", "kurt", "var_tanh", ...

struct FspNorm {
  std::array<double, 4> targets{};
  std::array<double, 4> weights{};
  static FspNorm preset(FspNormPreset preset);
  static FspNorm preset(const std::string& name);  // InvalidArgument listing the names for another

  bool any() const { return weights[0] > 0 || weights[1] > 0 || weights[2] > 0 || weights[3] > 0; }
};

struct FspOptions {
  explicit FspOptions(std::vector<int64_t> levels) : levels_(std::move(levels)) {}

  // A regulariser of its own, in place of vector_norm's preset.
  FspOptions& norm(FspNorm n) {
    norm_ = n;
    return *this;
  }
  int64_t codebook_dim() const { return static_cast<int64_t>(levels_.size()); }
  // Input dimension; linear projections in and out when it differs from len(levels). Unset: none.
  int64_t dim() const { return dim_.value_or(codebook_dim()); }
  FspNorm norm() const { return norm_ ? *norm_ : FspNorm::preset(vector_norm_); }
  int64_t codebook_size() const;  // the product of the levels

  // Every option: fsp_options.def, one line each (option_fields.h).
#define LOCKSTEP_OPTIONS FspOptions
#define LOCKSTEP_OPTIONS_FIELDS "lockstep/quant/fsp_options.def"
#include "lockstep/quant/option_fields.inc"

  // Throws InvalidArgument with the value: a field outside its limits, no levels, a level < 2 or
  // > 2^22, a product above 2^31, dim < 1, a negative or non-finite norm weight.
  void validate() const;

 private:
  std::optional<FspNorm> norm_;
};

// What the reference returns beside the output, of one call's tokens on this holder.
struct FspDiagnostics {
  at::Tensor level_indices;                       // (b, n, len(levels)) int64: each channel's bin
  at::Tensor mean, variance, skewness, kurtosis;  // (len(levels),) of the holder's tokens
  at::Tensor accept_rate;                         // share of perturbations inside (0, 1); undefined when none
};

class Fsp final : public Quantizer {
 public:
  // Projections, when needed, are initialised as torch.nn.Linear's from torch's default generator
  // (in, then out, as the reference).
  explicit Fsp(FspOptions options);

  std::string kind() const override { return "fsp"; }
  bool draws_per_item() const override { return options_.quantize_rate() < 1; }
  int64_t dim() const override { return options_.dim(); }
  int64_t codebook_size() const override { return options_.codebook_size(); }

  // Loss "norm" in training and evaluation, as the reference: in training of the global batch's
  // statistics (one reducer call "fsp.moments": count and the channels' first four power sums, in
  // float64), in evaluation of this holder's tokens (no reducer call). Perturbations draw one pair
  // of keys from ctx.generator and hash each element's global position (ctx.first_item).
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  at::Tensor encode(const at::Tensor& x) override;
  at::Tensor decode(const at::Tensor& indices) override;  // the bins' values, projected out
  // decode with need_inv_act's clamp to [eps, 1 - eps] before the inverse (the reference's indices_to_codes
  // eps; decode takes its default, 1e-6). InvalidArgument unless 0 <= eps < 0.5.
  at::Tensor decode_with(const at::Tensor& indices, double eps);

  // The reference's info: level indices, this holder's batch statistics and, in training with
  // quantize_rate < 1, the share of accepted perturbations (the same draws as quantize's for ctx).
  FspDiagnostics diagnostics(const at::Tensor& x, const QuantizeContext& ctx);
  // Indices (...) -> each channel's bin (..., len(levels)), the first level least significant.
  at::Tensor level_indices(const at::Tensor& indices) const;

  const FspOptions& options() const { return options_; }

 private:
  at::Tensor latents(const at::Tensor& x);                   // (b, n, dim) -> (b, n, cd), projected in
  at::Tensor bins(const at::Tensor& act, double eps) const;  // (.., cd) -> float bin of each channel
  at::Tensor value_of(const at::Tensor& act_of_bin) const;   // the output before project_out
  // The uniform draws in [0, 1) of each element of z (b, n, cd) for perturbation and selection.
  std::pair<at::Tensor, at::Tensor> draws(const at::Tensor& z, const QuantizeContext& ctx) const;

  FspOptions options_;
  at::Tensor levels_;  // float32 (cd,): buffer "_levels", as the reference names it
  at::Tensor basis_;   // int64 (cd,): buffer "_basis"
  torch::nn::Linear project_in_{nullptr};
  torch::nn::Linear project_out_{nullptr};
};

// The regulariser's value for the global sums s = (count, sum z, sum z^2, sum z^3, sum z^4), each
// power sum per channel (float64): differentiable wrt s. Exposed for tests.
at::Tensor fsp_norm_loss(const at::Tensor& sums, const FspNorm& norm, int64_t channels);

}  // namespace lockstep::quant
