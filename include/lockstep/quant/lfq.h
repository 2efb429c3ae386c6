// Lookup-free quantization (Yu et al. 2023) and, with `spherical`, binary spherical quantization
// (Zhao et al. 2024), as defined in docs/quantizers.md: each of log2 K code dimensions becomes
// +scale or -scale; the index is the bit pattern, first dimension most significant.
#pragma once

#include <optional>

#include "lockstep/quant/option_fields.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

namespace detail {
struct CosineSimLinearImpl;  // lfq.cpp
}  // namespace detail

struct LfqOptions {
  // codebook_size: a power of two K; each codebook has log2 K code dimensions.
  explicit LfqOptions(int64_t codebook_size) : codebook_size_(codebook_size) {}

  // Input dimension; unset (or 0 through the registry) means num_codebooks * log2 K (no projection).
  std::optional<int64_t> dim() const { return dim_; }

  // Every option: lfq_options.def, one line each (option_fields.h).
#define LOCKSTEP_OPTIONS LfqOptions
#define LOCKSTEP_OPTIONS_FIELDS "lockstep/quant/lfq_options.def"
#include "lockstep/quant/option_fields.inc"

  // Throws InvalidArgument naming the value: a field outside its limits, K not a power of two in
  // [2, 2^24], dim < 1.
  void validate() const;
};

// vector-quantize-pytorch's LossBreakdown of one LFQ call: the unweighted terms of its loss.
struct LfqLossTerms {
  at::Tensor per_sample_entropy;  // mean over the counted tokens of each token's code entropy
  at::Tensor codebook_entropy;    // entropy of the counted tokens' mean code probabilities
  at::Tensor commitment;          // mean squared distance to the codes (0 when its weight is 0)
};

class Lfq final : public Quantizer {
 public:
  explicit Lfq(LfqOptions options);

  std::string kind() const override { return "lfq"; }
  bool draws_per_item() const override { return options_.frac_per_sample_entropy() < 1; }
  int64_t dim() const override { return dim_; }
  int64_t codebook_size() const override { return options_.codebook_size(); }
  int64_t num_indices() const override { return options_.num_codebooks(); }
  MaskSupport mask_support() const override { return MaskSupport::StatisticsOnly; }

  // Training: losses "entropy" (always, one reducer call "lfq.avg_probs") and "commitment" (when
  // its weight > 0). Eval: no losses, no reducer call.
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  // The terms quantize() weights, of this holder's tokens alone (the tokens quantize() counts: the
  // mask, and the entropy subset drawn from ctx as quantize() draws it), differentiable wrt x; no
  // reducer call. Zeros in evaluation, as the reference's.
  LfqLossTerms loss_terms(const at::Tensor& x, const QuantizeContext& ctx);
  // x (b, n, dim) -> bool (b, n): the tokens that enter the entropy terms of a training call with ctx
  // (the mask's, and of those the subset drawn with frac_per_sample_entropy < 1), for checks by hand.
  at::Tensor entropy_subset(const at::Tensor& x, const QuantizeContext& ctx);
  at::Tensor encode(const at::Tensor& x) override;
  at::Tensor decode(const at::Tensor& indices) override;

  // One codebook's indices (...) int64 -> codes (..., bits) of +-scale (normalised when spherical), float32.
  at::Tensor indices_to_codes(const at::Tensor& indices) const;
  // codes (..., bits) -> indices (...): bit j set where code j > 0, bit 0 of the code is the MSB.
  at::Tensor codes_to_indices(const at::Tensor& codes) const;
  int64_t bits() const { return bits_; }  // log2 K, per codebook

  const LfqOptions& options() const { return options_; }

 private:
  // (b, n, dim) -> (b, n, num_codebooks, bits) in code space: projected, normalised when spherical.
  at::Tensor to_code_space(const at::Tensor& x);
  // (b, n, num_codebooks, bits) -> (b, n, dim).
  at::Tensor from_code_space(const at::Tensor& codes);
  // z (..., bits) -> q with the same shape: +-scale, normalised when spherical.
  at::Tensor quantize_codes(const at::Tensor& z) const;
  // z (b, n, c, bits) -> the tokens (N, c, bits) that enter the entropy terms: the mask's, and of
  // those the subset drawn from ctx with frac_per_sample_entropy < 1.
  at::Tensor entropy_tokens(const at::Tensor& z, const at::Tensor& mask, const QuantizeContext& ctx) const;
  // Their positions in z's tokens (N = b * n), int64 on the host.
  at::Tensor entropy_positions(const at::Tensor& z, const at::Tensor& mask, const QuantizeContext& ctx) const;
  // The unweighted commitment loss of the counted tokens: mse(z, q) over the mask's tokens.
  static at::Tensor commitment_of(const at::Tensor& z, const at::Tensor& q, const at::Tensor& mask);
  double code_value() const;  // a code coordinate's magnitude

  LfqOptions options_;
  int64_t dim_;
  int64_t bits_;
  torch::nn::Linear project_in_{nullptr};
  std::shared_ptr<detail::CosineSimLinearImpl> cosine_project_in_;  // instead of project_in_, cosine_sim_project_in
  torch::nn::Linear project_out_{nullptr};
  at::Tensor rotation_;  // (bits, bits) with orthogonal_rotation, else undefined
};

// The entropy terms, exposed for tests and benchmarks. Tokens are rows x: (n, d) in code space
// (one codebook's d = log2 K dimensions); every code coordinate is +-code_value (codebook_scale, or
// codebook_scale / sqrt(d) when spherical).

// mean_t H(p_t) with p_t = softmax_c(2 * inv_temperature * <x_t, c>), computed per bit in O(n d)
// (p_t factorises into Bernoullis with P(bit j) = sigmoid(4 * inv_temperature * code_value * x_tj)).
// Unclamped entropy: see lfq_entropy.cpp for how it differs from the reference's log clamp. 0 for n = 0.
at::Tensor lfq_per_sample_entropy(const at::Tensor& x, double inv_temperature, double code_value);

// sum_t p_t in index order, exactly (float rounding only), differentiable wrt x: x (n, d) -> (2^d,),
// or x (c, n, d) -> (c, 2^d) for c codebooks. One GEMM per chunk of the high and low bits' products
// (lfq_entropy.cpp): never an (n, K) matrix; each chunk's working set stays within budget_bytes.
at::Tensor lfq_sum_probs(const at::Tensor& x, double inv_temperature, double code_value,
                         int64_t budget_bytes = int64_t{64} << 20);

// Tokens per chunk of lfq_sum_probs for d = `bits` so that a chunk's working set, at about
// 2 (2^h + 2^l) elements of `element_bytes` per token (P_hi, P_lo and their gradients), fits
// `budget_bytes` (at least 1).
int64_t lfq_chunk_tokens(int64_t bits, int64_t element_bytes, int64_t budget_bytes);

// -sum p log(max(p, 1e-5)) over the last dimension, the reference's clamped entropy.
at::Tensor lfq_clamped_entropy(const at::Tensor& probs);

}  // namespace lockstep::quant
