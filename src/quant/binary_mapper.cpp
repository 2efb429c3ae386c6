#include "lockstep/quant/binary_mapper.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::quant {

namespace F = torch::nn::functional;

void BinaryMapperOptions::validate() const {
  LOCKSTEP_CHECK_ARG(bits_ >= 1 && bits_ <= 24, "binary mapper: bits = ", bits_,
                     " must lie in [1, 24] (each token's one-hot holds 2^bits values)");
}

BinaryMapper::BinaryMapper(BinaryMapperOptions options) : options_(options) {
  options_.validate();
  const at::Tensor powers = torch::pow(2, torch::arange(options_.bits(), torch::kInt64));
  codes_ = torch::arange(num_codes(), torch::kInt64).unsqueeze(1).bitwise_and(powers).ne(0);
}

at::Tensor BinaryMapper::codes(const at::Device& device) const { return codes_.to(device); }

at::Tensor BinaryMapper::flat_logits(const at::Tensor& logits) const {
  LOCKSTEP_CHECK_ARG(logits.dim() >= 1 && logits.size(-1) == options_.bits(), "binary mapper: logits must end in ",
                     options_.bits(), " bits, got ", logits.sizes());
  return logits.reshape({-1, options_.bits()});
}

BinaryMapping BinaryMapper::map(const at::Tensor& logits, double temperature, bool straight_through, bool deterministic,
                                at::Generator generator) const {
  LOCKSTEP_CHECK_ARG(temperature > 0, "binary mapper: temperature = ", temperature, " must be > 0");
  const at::Tensor flat = flat_logits(logits);
  const at::Tensor prob = (flat / temperature).sigmoid();
  const at::Tensor bits =
      deterministic ? prob.gt(0.5).to(torch::kInt64) : at::bernoulli(prob.detach(), generator).to(torch::kInt64);
  const at::Tensor powers = torch::pow(2, torch::arange(options_.bits(), flat.options().dtype(torch::kInt64)));
  const at::Tensor indices = (bits * powers).sum(-1);
  at::Tensor one_hot = F::one_hot(indices, num_codes()).to(torch::kFloat32);
  if (straight_through) {
    // The codes' joint probability (at temperature 1, as the reference) carries the gradient.
    const at::Tensor on = codes(flat.device()).to(flat.scalar_type());
    const at::Tensor soft =
        (torch::matmul(F::logsigmoid(flat), on.t()) + torch::matmul(F::logsigmoid(-flat), (1 - on).t())).exp();
    one_hot = one_hot + soft - soft.detach();
  }
  std::vector<int64_t> lead(logits.sizes().begin(), logits.sizes().end() - 1);
  std::vector<int64_t> shape = lead;
  shape.push_back(num_codes());
  return {one_hot.reshape(shape), indices.reshape(lead)};
}

at::Tensor BinaryMapper::bit_entropy(const at::Tensor& logits) const {
  const at::Tensor flat = flat_logits(logits);
  const at::Tensor prob = flat.sigmoid();
  const at::Tensor entropy = -(prob * F::logsigmoid(flat) + (1 - prob) * F::logsigmoid(-flat)).sum(-1);
  return entropy.reshape(std::vector<int64_t>(logits.sizes().begin(), logits.sizes().end() - 1));
}

at::Tensor BinaryMapper::aux_kl_loss(const at::Tensor& logits, bool reduce) const {
  const at::Tensor entropy = bit_entropy(logits).reshape(-1);
  const at::Tensor kl = static_cast<double>(options_.bits()) * std::log(2.0) - entropy;
  const at::Tensor loss = torch::relu(kl - options_.kl_loss_threshold());
  if (reduce) return loss.mean();
  return loss.reshape(std::vector<int64_t>(logits.sizes().begin(), logits.sizes().end() - 1));
}

at::Tensor BinaryMapper::log_prob(const at::Tensor& logits, const at::Tensor& indices, bool sum_bits) const {
  const at::Tensor flat = flat_logits(logits);
  const at::Tensor idx = indices.reshape(-1).to(torch::kInt64);
  LOCKSTEP_CHECK_ARG(idx.size(0) == flat.size(0), "binary mapper: ", idx.size(0), " indices for ", flat.size(0),
                     " tokens of logits ", logits.sizes());
  LOCKSTEP_CHECK_ARG(idx.numel() == 0 || (idx.min().item<int64_t>() >= 0 && idx.max().item<int64_t>() < num_codes()),
                     "binary mapper: indices must lie in [0, ", num_codes(), ")");
  const at::Tensor drawn = codes(flat.device()).index_select(0, idx.to(flat.device()));
  const at::Tensor per_bit = torch::where(drawn, F::logsigmoid(flat), F::logsigmoid(-flat));
  if (!sum_bits) return per_bit.reshape(logits.sizes());
  return per_bit.sum(-1).reshape(std::vector<int64_t>(logits.sizes().begin(), logits.sizes().end() - 1));
}

}  // namespace lockstep::quant
