// SimVQ (Zhu et al. 2024, "Addressing representation collapse in vector quantized models with one
// linear layer"), as defined in docs/quantizers.md section "SimVQ" after vector-quantize-pytorch's
// SimVQ: a frozen random codebook whose codes reach the tokens through one learned linear map, so
// every code moves with each gradient step and none is left dead. No statistics, no randomness.
#pragma once

#include <optional>

#include <torch/nn/modules/linear.h>

#include "lockstep/quant/option_fields.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

struct SimVqOptions {
  SimVqOptions(int64_t dim, int64_t codebook_size) : dim_(dim), codebook_size_(codebook_size) {}

  // Length of the frozen codes, mapped to dim by the learned linear layer; unset means dim.
  int64_t frozen_codebook_dim() const { return frozen_codebook_dim_.value_or(dim_); }

  // Every option: simvq_options.def, one line each (option_fields.h).
#define LOCKSTEP_OPTIONS SimVqOptions
#define LOCKSTEP_OPTIONS_FIELDS "lockstep/quant/simvq_options.def"
#include "lockstep/quant/option_fields.inc"

  // Throws InvalidArgument with the value: a field outside its limits, dim, codebook_size or
  // frozen_codebook_dim < 1.
  void validate() const;
};

class SimVq final : public Quantizer {
 public:
  // The frozen codebook is randn(K, fd) / sqrt(fd), then the map's weight (dim, fd) is initialised as
  // torch.nn.Linear's, both from torch's default generator in that order (as the reference draws them).
  explicit SimVq(SimVqOptions options);

  std::string kind() const override { return "simvq"; }
  int64_t dim() const override { return options_.dim(); }
  int64_t codebook_size() const override { return options_.codebook_size(); }

  // Nearest code of the implicit codebook (Euclidean), or of ctx.codebook when the caller gives the
  // codes (its own map of frozen_codebook(), the Python module's codebook_transform). Loss "commitment".
  // Training and evaluation compute the same; nothing is reduced and no state changes, so
  // data-parallel training needs only the gradient averaging of the map's weights.
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  at::Tensor encode(const at::Tensor& x) override;
  at::Tensor decode(const at::Tensor& indices) override;

  const SimVqOptions& options() const { return options_; }
  // The codes the tokens see, (K, dim): the frozen codebook through the map (differentiable).
  at::Tensor implicit_codebook() const;
  const at::Tensor& frozen_codebook() const { return frozen_codebook_; }

 private:
  // A caller's codes (K, dim), checked, in float32 (differentiable).
  at::Tensor given_codebook(const at::Tensor& codebook) const;

  SimVqOptions options_;
  at::Tensor frozen_codebook_;  // buffer (K, fd)
  torch::nn::Linear code_transform_{nullptr};
};

}  // namespace lockstep::quant
