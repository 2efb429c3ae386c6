#include "lockstep/quant/simvq.h"

#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {

void SimVqOptions::validate() const {
  check_fields("simvq", *this);
  LOCKSTEP_CHECK_ARG(dim_ >= 1, "simvq: dim = ", dim_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(codebook_size_ >= 1, "simvq: codebook_size = ", codebook_size_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(frozen_codebook_dim() >= 1, "simvq: frozen_codebook_dim = ", frozen_codebook_dim(),
                     " must be >= 1");
}

SimVq::SimVq(SimVqOptions options) : Quantizer("SimVq"), options_(std::move(options)) {
  options_.validate();
  const int64_t fd = options_.frozen_codebook_dim();
  // The reference's order of draws: the frozen codes first, then the map's initialisation.
  frozen_codebook_ = register_buffer(
      "frozen_codebook", torch::randn({options_.codebook_size(), fd}) * (1.0 / std::sqrt(static_cast<double>(fd))));
  code_transform_ =
      register_module("code_transform", torch::nn::Linear(torch::nn::LinearOptions(fd, options_.dim()).bias(false)));
}

at::Tensor SimVq::given_codebook(const at::Tensor& codebook) const {
  LOCKSTEP_CHECK_ARG(
      codebook.dim() == 2 && codebook.size(0) == options_.codebook_size() && codebook.size(1) == options_.dim(),
      "simvq: the codebook_transform must map the frozen codes to (", options_.codebook_size(), ", ", options_.dim(),
      "), got ", codebook.sizes());
  LOCKSTEP_CHECK_ARG(codebook.is_floating_point(), "simvq: the codebook_transform gave ", codebook.scalar_type(),
                     " codes, expected floating point");
  return codebook.to(torch::kFloat32);
}

at::Tensor SimVq::implicit_codebook() const { return torch::linear(frozen_codebook_, code_transform_->weight); }

QuantizerOutput SimVq::quantize(const at::Tensor& x, const QuantizeContext& ctx) {
  check_no_mask(ctx, "simvq");
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == options_.dim(), "simvq: expected tokens (b, n, ", options_.dim(),
                     "), got ", x.sizes());
  const int64_t b = x.size(0);
  const int64_t n = x.size(1);
  const at::Tensor tokens = x.to(torch::kFloat32).reshape({b * n, options_.dim()});
  const at::Tensor codebook = ctx.codebook.defined() ? given_codebook(ctx.codebook) : implicit_codebook();
  at::Tensor indices;
  {
    torch::NoGradGuard no_grad;
    indices = nearest_code(tokens.detach(), codebook.detach(), Metric::Euclidean).indices;
  }
  const at::Tensor q = codebook.index_select(0, indices);  // differentiable in the map's weight
  // Tokens pulled to codes at a quarter of the weight that moves the codes (through the map).
  // A holder without tokens (an all-padding rank) adds a zero loss where the mean of nothing is NaN.
  at::Tensor loss = tokens.size(0) == 0
                        ? (q.sum() + tokens.sum()) * 0.0
                        : torch::mse_loss(q, tokens.detach()) +
                              torch::mse_loss(tokens, q.detach()) * options_.input_to_quantize_commit_loss_weight();
  const at::Tensor out = options_.rotation_trick() ? rotate_to(tokens, q) : tokens + (q - tokens).detach();
  QuantizerOutput result;
  result.quantized = out.reshape({b, n, options_.dim()}).to(x.scalar_type());
  result.indices = indices.reshape({b, n});
  result.losses["commitment"] = loss * options_.commitment_weight();
  return result;
}

at::Tensor SimVq::encode(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == options_.dim(), "simvq: expected tokens (b, n, ", options_.dim(),
                     "), got ", x.sizes());
  torch::NoGradGuard no_grad;
  const at::Tensor tokens = x.to(torch::kFloat32).reshape({-1, options_.dim()});
  return nearest_code(tokens, implicit_codebook(), Metric::Euclidean).indices.reshape({x.size(0), x.size(1)});
}

at::Tensor SimVq::decode(const at::Tensor& indices) {
  LOCKSTEP_CHECK_ARG(indices.dim() == 2, "simvq: expected indices (b, n), got ", indices.sizes());
  const int64_t k = options_.codebook_size();
  LOCKSTEP_CHECK_ARG(indices.numel() == 0 || (indices.min().item<int64_t>() >= 0 && indices.max().item<int64_t>() < k),
                     "simvq: indices must lie in [0, ", k, ")");
  // The frozen codes first, then the map: the reference's indices_to_codes, differentiable in the map.
  const at::Tensor frozen = frozen_codebook_.index_select(0, indices.to(torch::kInt64).reshape({-1}));
  return torch::linear(frozen, code_transform_->weight).reshape({indices.size(0), indices.size(1), options_.dim()});
}

}  // namespace lockstep::quant
