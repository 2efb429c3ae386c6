#include "lockstep/quant/fsq.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {
// Rounding and flooring whose gradient is the identity (straight-through estimator).
at::Tensor round_ste(const at::Tensor& z) { return z + (z.round() - z).detach(); }
at::Tensor floor_ste(const at::Tensor& z) { return z + (z.floor() - z).detach(); }
}  // namespace

void FsqOptions::validate() const {
  LOCKSTEP_CHECK_ARG(!levels_.empty(), "fsq: levels must not be empty");
  int64_t product = 1;
  for (size_t i = 0; i < levels_.size(); ++i) {
    LOCKSTEP_CHECK_ARG(levels_[i] >= 2, "fsq: levels[", i, "] = ", levels_[i], " must be >= 2");
    product *= levels_[i];
    LOCKSTEP_CHECK_ARG(product <= (int64_t{1} << 31), "fsq: the product of levels exceeds 2^31 at levels[", i,
                       "]; use several codebooks instead");
  }
  LOCKSTEP_CHECK_ARG(num_codebooks_ >= 1, "fsq: num_codebooks = ", num_codebooks_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(!dim_ || *dim_ >= 1, "fsq: dim = ", dim_.value_or(0), " must be >= 1");
}

Fsq::Fsq(FsqOptions options) : Quantizer("Fsq"), options_(std::move(options)) {
  options_.validate();
  const auto& levels = options_.levels();
  const int64_t code_dim = static_cast<int64_t>(levels.size()) * options_.num_codebooks();
  dim_ = options_.dim().value_or(code_dim);
  codebook_size_ = 1;
  std::vector<int64_t> basis;
  for (int64_t l : levels) {
    basis.push_back(codebook_size_);
    codebook_size_ *= l;
  }
  levels_ = torch::tensor(levels, torch::kInt64).to(torch::kFloat32);
  basis_ = torch::tensor(basis, torch::kInt64);
  if (dim_ != code_dim) {
    project_in_ = register_module("project_in", torch::nn::Linear(dim_, code_dim));
    project_out_ = register_module("project_out", torch::nn::Linear(code_dim, dim_));
  }
}

at::Tensor Fsq::quantize_codes(const at::Tensor& z) const {
  if (options_.preserve_symmetry()) {
    const at::Tensor lm1 = levels_ - 1;
    return floor_ste(lm1 * (z.tanh() + 1) / 2 + 0.5) * (2 / lm1) - 1;
  }
  // Default bound: tanh scaled so that rounding yields exactly L values; even L are offset by
  // half a step so that the grid is centred.
  const double eps = 1e-3;
  const at::Tensor half_l = (levels_ - 1) * (1 + eps) / 2;
  const at::Tensor offset = torch::where(levels_.remainder(2) == 0, torch::full_like(levels_, 0.5),
                                         torch::zeros_like(levels_));
  const at::Tensor shift = (offset / half_l).atanh();
  const at::Tensor bounded = (z + shift).tanh() * half_l - offset;
  return round_ste(bounded) / (levels_ / 2).floor();
}

at::Tensor Fsq::codes_to_indices(const at::Tensor& codes) const {
  at::Tensor level_index;
  if (options_.preserve_symmetry()) {
    level_index = (codes + 1) / (2 / (levels_ - 1));
  } else {
    const at::Tensor half_width = (levels_ / 2).floor();
    level_index = codes * half_width + half_width;
  }
  return (level_index.round().to(torch::kInt64) * basis_).sum(-1);
}

at::Tensor Fsq::indices_to_codes(const at::Tensor& indices) const {
  const at::Tensor level_index =
      indices.unsqueeze(-1).floor_divide(basis_).remainder(levels_.to(torch::kInt64)).to(torch::kFloat32);
  if (options_.preserve_symmetry()) return level_index * (2 / (levels_ - 1)) - 1;
  const at::Tensor half_width = (levels_ / 2).floor();
  return (level_index - half_width) / half_width;
}

at::Tensor Fsq::to_code_space(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == dim_, "fsq: expected tokens (b, n, ", dim_, "), got ",
                     x.sizes());
  at::Tensor z = project_in_ ? project_in_->forward(x) : x;
  return z.reshape({x.size(0), x.size(1), options_.num_codebooks(), static_cast<int64_t>(options_.levels().size())});
}

at::Tensor Fsq::from_code_space(const at::Tensor& codes) {
  at::Tensor flat = codes.flatten(2);
  return project_out_ ? project_out_->forward(flat) : flat;
}

at::Tensor Fsq::squeeze_indices(const at::Tensor& indices) const {
  return options_.num_codebooks() == 1 ? indices.squeeze(-1) : indices;
}

QuantizerOutput Fsq::quantize(const at::Tensor& x, const QuantizeContext&) {
  // FSQ is computed in float32 whatever the input precision, as the reference does.
  const at::Tensor codes = quantize_codes(to_code_space(x).to(torch::kFloat32));
  QuantizerOutput out;
  out.indices = squeeze_indices(codes_to_indices(codes.detach()));
  out.quantized = from_code_space(codes).to(x.scalar_type());
  return out;
}

at::Tensor Fsq::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  return squeeze_indices(codes_to_indices(quantize_codes(to_code_space(x).to(torch::kFloat32))));
}

at::Tensor Fsq::decode(const at::Tensor& indices) {
  const int64_t k = options_.num_codebooks();
  const at::Tensor idx = k == 1 ? indices.unsqueeze(-1) : indices;
  LOCKSTEP_CHECK_ARG(idx.dim() == 3 && idx.size(2) == k, "fsq: expected indices (b, n", k == 1 ? "" : ", codebooks",
                     "), got ", indices.sizes());
  LOCKSTEP_CHECK_ARG(idx.numel() == 0 || (idx.min().item<int64_t>() >= 0 && idx.max().item<int64_t>() < codebook_size_),
                     "fsq: indices must lie in [0, ", codebook_size_, ")");
  return from_code_space(indices_to_codes(idx));
}

}  // namespace lockstep::quant
