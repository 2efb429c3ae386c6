// Lookup-free quantization (Yu et al. 2023) and, with `spherical`, binary spherical quantization
// (Zhao et al. 2024), as defined in docs/quantizers.md: each of log2 K code dimensions becomes
// +scale or -scale; the index is the bit pattern, first dimension most significant.
#pragma once

#include <optional>

#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

namespace detail {
struct CosineSimLinearImpl;  // lfq.cpp
}  // namespace detail

struct LfqOptions {
  // codebook_size: a power of two K; each codebook has log2 K code dimensions.
  explicit LfqOptions(int64_t codebook_size) : codebook_size_(codebook_size) {}

  // Input dimension; unset (or 0 through the registry) means num_codebooks * log2 K (no projection).
  LfqOptions& dim(int64_t d) {
    dim_ = d;
    return *this;
  }
  LfqOptions& entropy_loss_weight(double w) {
    entropy_loss_weight_ = w;
    return *this;
  }
  LfqOptions& commitment_loss_weight(double w) {
    commitment_loss_weight_ = w;
    return *this;
  }
  LfqOptions& diversity_gamma(double g) {
    diversity_gamma_ = g;
    return *this;
  }
  LfqOptions& codebook_scale(double s) {
    codebook_scale_ = s;
    return *this;
  }
  LfqOptions& inv_temperature(double t) {
    inv_temperature_ = t;
    return *this;
  }
  // f in (0, 1]: the tokens of each training call that enter both the per-sample entropy and the
  // average probability. Each token joins with probability f, decided by a hash of (one draw of
  // ctx.generator, the token's global position in the batch), so W ranks choose exactly the tokens
  // one process would (the reference takes exactly int(n * f) at random; here the count is binomial).
  LfqOptions& frac_per_sample_entropy(double f) {
    frac_per_sample_entropy_ = f;
    return *this;
  }
  // BSQ: l2-normalise the inputs and the codes (times codebook_scale).
  LfqOptions& spherical(bool on) {
    spherical_ = on;
    return *this;
  }
  // c >= 1 codebooks of K codes each: the code space has c * log2 K dimensions, codebook g owning
  // dimensions [g log2 K, (g + 1) log2 K); indices (b, n, c), or (b, n) when c = 1. Entropies
  // are per codebook, averaged over codebooks; spherical normalises each group.
  LfqOptions& num_codebooks(int64_t n) {
    num_codebooks_ = n;
    return *this;
  }

  // The projections in and out have biases (the reference's projection_has_bias).
  LfqOptions& projection_has_bias(bool on) {
    projection_has_bias_ = on;
    return *this;
  }
  // Each codebook's code-space vectors turned by a fixed random orthogonal matrix (buffer orthogonal_rot,
  // drawn from the default generator) before quantization and back after (the reference's
  // orthogonal_rotation; better code use without an auxiliary loss).
  LfqOptions& orthogonal_rotation(bool on) {
    orthogonal_rotation_ = on;
    return *this;
  }
  // Projections in and out even when dim equals the code space's (the reference's has_projections=True).
  LfqOptions& force_projections(bool on) {
    force_projections_ = on;
    return *this;
  }
  // s > 0: the projection in (when there is one) is vector-quantize-pytorch's CosineSimLinear, the unit input
  // times the unit columns of its weight (dim, code dims), times s (cosine_sim_project_in); 0: a linear layer.
  LfqOptions& cosine_sim_project_in(double s) {
    cosine_sim_project_in_ = s;
    return *this;
  }
  // c > 0: the projected input squashed to tanh(z / c) c before quantization (soft_clamp_input_value); 0: none.
  LfqOptions& soft_clamp(double c) {
    soft_clamp_ = c;
    return *this;
  }
  // The entropy term made positive: softplus(per-sample - gamma * codebook entropy + offset), the
  // reference's experimental_softplus_entropy_loss with entropy_loss_offset.
  LfqOptions& softplus_entropy(bool on) {
    softplus_entropy_ = on;
    return *this;
  }
  LfqOptions& entropy_loss_offset(double o) {
    entropy_loss_offset_ = o;
    return *this;
  }

  int64_t codebook_size() const { return codebook_size_; }
  std::optional<int64_t> dim() const { return dim_; }
  bool projection_has_bias() const { return projection_has_bias_; }
  bool force_projections() const { return force_projections_; }
  bool orthogonal_rotation() const { return orthogonal_rotation_; }
  double soft_clamp() const { return soft_clamp_; }
  double cosine_sim_project_in() const { return cosine_sim_project_in_; }
  bool softplus_entropy() const { return softplus_entropy_; }
  double entropy_loss_offset() const { return entropy_loss_offset_; }
  double entropy_loss_weight() const { return entropy_loss_weight_; }
  double commitment_loss_weight() const { return commitment_loss_weight_; }
  double diversity_gamma() const { return diversity_gamma_; }
  double codebook_scale() const { return codebook_scale_; }
  double inv_temperature() const { return inv_temperature_; }
  double frac_per_sample_entropy() const { return frac_per_sample_entropy_; }
  bool spherical() const { return spherical_; }
  int64_t num_codebooks() const { return num_codebooks_; }

  // Throws InvalidArgument naming the value: K not a power of two in [2, 2^24], dim < 1, negative
  // weights, scale or inv_temperature <= 0, frac_per_sample_entropy outside (0, 1], num_codebooks < 1,
  // a negative soft clamp, an offset that is not finite.
  void validate() const;

 private:
  int64_t codebook_size_;
  std::optional<int64_t> dim_;
  double entropy_loss_weight_ = 0.1;
  // Not the reference's 0: without it an autoencoder's straight-through latents drift and the codes
  // collapse (10 of 1024 used after 300 demo steps, 1010 with 0.25).
  double commitment_loss_weight_ = 0.25;
  double diversity_gamma_ = 1.0;
  double codebook_scale_ = 1.0;
  double inv_temperature_ = 100.0;
  double frac_per_sample_entropy_ = 1.0;
  bool spherical_ = false;
  int64_t num_codebooks_ = 1;
  bool projection_has_bias_ = true;
  bool force_projections_ = false;
  bool orthogonal_rotation_ = false;
  double soft_clamp_ = 0;
  double cosine_sim_project_in_ = 0;
  bool softplus_entropy_ = false;
  double entropy_loss_offset_ = 5.0;
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
