#include "lockstep/quant/latent_quantize.h"

#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::quant {

int64_t LatentQuantizeOptions::codebook_size() const {
  int64_t k = 1;
  for (int64_t l : levels_) k *= l;
  return k;
}

void LatentQuantizeOptions::validate() const {
  check_fields("latent", *this);
  LOCKSTEP_CHECK_ARG(!levels_.empty(), "latent: levels must not be empty");
  double product = 1;
  for (int64_t l : levels_) {
    LOCKSTEP_CHECK_ARG(l >= 2, "latent: every level must be >= 2, got ", l);
    product *= static_cast<double>(l);
  }
  LOCKSTEP_CHECK_ARG(product <= 2147483648.0, "latent: the levels' product ", product, " exceeds 2^31 codes");
  LOCKSTEP_CHECK_ARG(dim() >= 1, "latent: dim = ", dim(), " must be >= 1");
}

LatentQuantize::LatentQuantize(LatentQuantizeOptions options)
    : Quantizer("LatentQuantize"), options_(std::move(options)) {
  options_.validate();
  const int64_t inner = options_.codebook_dim() * options_.num_codebooks();
  if (options_.dim() != inner) {  // the reference's order of draws: in, then out
    project_in_ = register_module("project_in", torch::nn::Linear(options_.dim(), inner));
    project_out_ = register_module("project_out", torch::nn::Linear(inner, options_.dim()));
  }
  auto holder = register_module("values_per_latent", std::make_shared<torch::nn::Module>());
  for (size_t i = 0; i < options_.levels().size(); ++i) {
    const int64_t level = options_.levels()[i];
    const at::Tensor values = level % 2 == 1 ? torch::linspace(-0.5, 0.5, level)
                                             : torch::arange(level, torch::kFloat32) / static_cast<double>(level) - 0.5;
    values_.push_back(holder->register_buffer(std::to_string(i), values));
  }
}

at::Tensor LatentQuantize::latents(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == options_.dim(), "latent: expected tokens (b, n, ", options_.dim(),
                     "), got ", x.sizes());
  at::Tensor z = x.to(torch::kFloat32);
  if (project_in_) z = project_in_->forward(z);
  return z.reshape({x.size(0), x.size(1), options_.num_codebooks(), options_.codebook_dim()});
}

at::Tensor LatentQuantize::positions(const at::Tensor& z) const {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> per_channel;
  for (int64_t i = 0; i < options_.codebook_dim(); ++i) {
    const at::Tensor zi = z.select(3, i).unsqueeze(-1);                                             // (b, n, C, 1)
    per_channel.push_back((zi - values_[static_cast<size_t>(i)].to(z.device())).abs().argmin(-1));  // first of ties
  }
  return torch::stack(per_channel, -1);
}

at::Tensor LatentQuantize::values_at(const at::Tensor& positions) const {
  std::vector<at::Tensor> per_channel;
  for (int64_t i = 0; i < options_.codebook_dim(); ++i) {
    const at::Tensor& v = values_[static_cast<size_t>(i)];
    per_channel.push_back(v.to(positions.device()).index({positions.select(3, i)}));
  }
  return torch::stack(per_channel, -1);
}

// Mixed radix, the first channel least significant: index = sum_i p_i prod_{j<i} L_j.
at::Tensor LatentQuantize::indices_of(const at::Tensor& positions) const {
  at::Tensor index = torch::zeros(positions.sizes().slice(0, 3), positions.options());
  int64_t basis = 1;
  for (int64_t i = 0; i < options_.codebook_dim(); ++i) {
    index = index + positions.select(3, i) * basis;
    basis *= options_.levels()[static_cast<size_t>(i)];
  }
  return index;
}

at::Tensor LatentQuantize::output_of(const at::Tensor& codes) const {
  const at::Tensor flat = codes.reshape({codes.size(0), codes.size(1), codes.size(2) * codes.size(3)});
  return project_out_ ? torch::linear(flat, project_out_->weight, project_out_->bias) : flat;
}

QuantizerOutput LatentQuantize::quantize(const at::Tensor& x, const QuantizeContext& ctx) {
  check_no_mask(ctx, "latent");
  const at::Tensor z = latents(x);
  const at::Tensor p = positions(z);
  const at::Tensor codes = z + (values_at(p) - z).detach();  // straight-through
  QuantizerOutput out;
  out.quantized = output_of(codes).to(x.scalar_type());
  out.indices = options_.num_codebooks() == 1 ? indices_of(p).squeeze(2) : indices_of(p);
  if (is_training()) {
    const at::Tensor input = x.to(torch::kFloat32);
    const at::Tensor result = out.quantized.to(torch::kFloat32);
    // A holder without tokens adds zero where the mean of nothing is NaN.
    const auto mse = [&](const at::Tensor& a, const at::Tensor& b) {
      return a.numel() == 0 ? (a.sum() + b.sum()) * 0.0 : torch::mse_loss(a, b);
    };
    if (options_.commitment_loss_weight() > 0) {
      out.losses["commitment"] = mse(result, input.detach()) * options_.commitment_loss_weight();
    }
    if (options_.quantization_loss_weight() > 0) {
      out.losses["quantization"] = mse(input, result.detach()) * options_.quantization_loss_weight();
    }
  }
  return out;
}

at::Tensor LatentQuantize::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  const at::Tensor index = indices_of(positions(latents(x)));
  return options_.num_codebooks() == 1 ? index.squeeze(2) : index;
}

at::Tensor LatentQuantize::decode(const at::Tensor& indices) {
  const int64_t c = options_.num_codebooks();
  LOCKSTEP_CHECK_ARG(c == 1 ? indices.dim() == 2 : (indices.dim() == 3 && indices.size(2) == c),
                     "latent: expected indices ", c == 1 ? "(b, n)" : lockstep::detail::concat("(b, n, ", c, ")"),
                     ", got ", indices.sizes());
  const int64_t k = options_.codebook_size();
  LOCKSTEP_CHECK_ARG(indices.numel() == 0 || (indices.min().item<int64_t>() >= 0 && indices.max().item<int64_t>() < k),
                     "latent: indices must lie in [0, ", k, ")");
  const at::Tensor idx = indices.to(torch::kInt64).reshape({indices.size(0), indices.size(1), c});
  std::vector<at::Tensor> per_channel;
  int64_t basis = 1;
  for (int64_t level : options_.levels()) {
    per_channel.push_back(torch::div(idx, basis, "floor").remainder(level));
    basis *= level;
  }
  return output_of(values_at(torch::stack(per_channel, -1)));
}

}  // namespace lockstep::quant
