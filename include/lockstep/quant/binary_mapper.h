// The binary mapper (Fleuret 2025, arXiv 2510.17558), as vector-quantize-pytorch's BinaryMapper:
// `bits` logits per token pick one of 2^bits codes, each bit drawn from sigmoid(logit / temperature)
// (or thresholded at 1/2), returned as a one-hot whose straight-through gradient is that of the codes'
// joint probability; an auxiliary loss keeps each token's bit entropy within a threshold of its
// maximum. No state and no statistics: nothing to reduce over ranks.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>

namespace lockstep::quant {

struct BinaryMapperOptions {
  explicit BinaryMapperOptions(int64_t bits) : bits_(bits) {}

  // The KL loss is relu(bits ln 2 - H - threshold) for the tokens' bit entropy H (nats).
  BinaryMapperOptions& kl_loss_threshold(double t) {
    kl_loss_threshold_ = t;
    return *this;
  }

  int64_t bits() const { return bits_; }
  double kl_loss_threshold() const { return kl_loss_threshold_; }

  // InvalidArgument with the value: bits outside [1, 24] (a one-hot of 2^bits values per token; the
  // reference sets no limit).
  void validate() const;

 private:
  int64_t bits_;
  double kl_loss_threshold_ = std::log(2.0);  // one bit
};

struct BinaryMapping {
  at::Tensor one_hot;  // (..., 2^bits) float
  at::Tensor indices;  // (...) int64: sum of 2^i over the bits i drawn 1
};

class BinaryMapper {
 public:
  explicit BinaryMapper(BinaryMapperOptions options);

  const BinaryMapperOptions& options() const { return options_; }
  int64_t num_codes() const { return int64_t{1} << options_.bits(); }
  // (2^bits, bits) bool: code k's bits, lowest first.
  at::Tensor codes(const at::Device& device) const;

  // logits (..., bits) -> the drawn codes. `generator` undefined: torch's default CPU generator, whose
  // draws are then those of the reference's `bernoulli()`.
  BinaryMapping map(const at::Tensor& logits, double temperature, bool straight_through, bool deterministic,
                    at::Generator generator = {}) const;
  // Each token's bit entropy in nats (...): the sum over its bits of the Bernoulli entropies.
  at::Tensor bit_entropy(const at::Tensor& logits) const;
  // The KL loss per token (...), or its mean when `reduce`.
  at::Tensor aux_kl_loss(const at::Tensor& logits, bool reduce) const;
  // log p(code | logits): per bit (..., bits), or summed (...).
  at::Tensor log_prob(const at::Tensor& logits, const at::Tensor& indices, bool sum_bits) const;

 private:
  at::Tensor flat_logits(const at::Tensor& logits) const;  // (..., bits) -> (N, bits), checked

  BinaryMapperOptions options_;
  at::Tensor codes_;  // codes(CPU), made once
};

}  // namespace lockstep::quant
