// Vector quantizer with an EMA codebook (van den Oord et al. 2017; the EMA variant of Razavi et
// al. 2019), as defined in docs/quantizers.md section "VQ" after lucidrains/vector-quantize-pytorch.
#pragma once

#include <optional>

#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

enum class VqEstimator {
  StraightThrough,  // x + (q - x).detach()
  RotationTrick,    // Fifty et al. 2024: forward value q, gradient rotated from x onto q
};

struct VqOptions {
  VqOptions(int64_t dim, int64_t codebook_size) : dim_(dim), codebook_size_(codebook_size) {}

  VqOptions& decay(double v) { decay_ = v; return *this; }
  VqOptions& eps(double v) { eps_ = v; return *this; }
  VqOptions& commitment_weight(double v) { commitment_weight_ = v; return *this; }
  VqOptions& use_cosine_sim(bool on) { use_cosine_sim_ = on; return *this; }
  // Unset: the rotation trick when dim > 1, else straight-through (the reference's default).
  VqOptions& estimator(VqEstimator e) { estimator_ = e; return *this; }
  VqOptions& kmeans_init(bool on) { kmeans_init_ = on; return *this; }
  VqOptions& kmeans_iters(int64_t v) { kmeans_iters_ = v; return *this; }
  // Codes whose EMA cluster size falls below this are replaced by batch vectors; 0 disables.
  VqOptions& threshold_ema_dead_code(double v) { threshold_ema_dead_code_ = v; return *this; }

  int64_t dim() const { return dim_; }
  int64_t codebook_size() const { return codebook_size_; }
  double decay() const { return decay_; }
  double eps() const { return eps_; }
  double commitment_weight() const { return commitment_weight_; }
  bool use_cosine_sim() const { return use_cosine_sim_; }
  VqEstimator estimator() const {
    return estimator_.value_or(dim_ > 1 ? VqEstimator::RotationTrick : VqEstimator::StraightThrough);
  }
  bool kmeans_init() const { return kmeans_init_; }
  int64_t kmeans_iters() const { return kmeans_iters_; }
  double threshold_ema_dead_code() const { return threshold_ema_dead_code_; }

  // Throws InvalidArgument with the value: dim or codebook_size < 1, decay outside [0, 1),
  // eps <= 0, commitment_weight < 0, kmeans_iters < 0, threshold < 0.
  void validate() const;

 private:
  int64_t dim_;
  int64_t codebook_size_;
  double decay_ = 0.8;
  double eps_ = 1e-5;
  double commitment_weight_ = 1.0;
  bool use_cosine_sim_ = false;
  std::optional<VqEstimator> estimator_;
  bool kmeans_init_ = false;
  int64_t kmeans_iters_ = 10;
  double threshold_ema_dead_code_ = 0;
};

class Vq final : public Quantizer {
 public:
  // The initial codebook is Kaiming-uniform drawn from `generator`, or from torch's default CPU
  // generator when it is undefined (zeros instead when kmeans_init: k-means sets it).
  explicit Vq(VqOptions options, at::Generator generator = {});

  std::string kind() const override { return "vq"; }
  int64_t dim() const override { return options_.dim(); }
  int64_t codebook_size() const override { return options_.codebook_size(); }

  // Training mode: one ctx.reducer->sum_ per call (two tensors, tag "vq.ema"), plus k-means'
  // kmeans_iters calls ("vq.kmeans") on the first training call when kmeans_init. Randomness
  // (k-means seeds, dead-code samples) comes from ctx.generator, else torch's default generator.
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  at::Tensor encode(const at::Tensor& x) override;
  at::Tensor decode(const at::Tensor& indices) override;

  const VqOptions& options() const { return options_; }
  // Codebook state, all registered buffers: embed (K, d), cluster_size (K), embed_avg (K, d),
  // initted () float (1 once the codebook holds real codes).
  const at::Tensor& embed() const { return embed_; }
  const at::Tensor& cluster_size() const { return cluster_size_; }
  const at::Tensor& embed_avg() const { return embed_avg_; }
  bool initted() const;

 private:
  // x: (n, d) float -> the tokens the codebook sees (l2-normalised when cosine).
  at::Tensor prepare(const at::Tensor& x) const;
  void kmeans_init_from(const at::Tensor& flat, const QuantizeContext& ctx);
  void ema_update(const at::Tensor& flat, const at::Tensor& indices, Reducer& reducer);
  void expire_dead_codes(const at::Tensor& flat, at::Generator generator);

  VqOptions options_;
  Metric metric_;
  at::Tensor embed_;
  at::Tensor cluster_size_;
  at::Tensor embed_avg_;
  at::Tensor initted_;
};

// The rotation trick's output (n, d) for tokens x (n, d) and their codes q (n, d): value q,
// gradient to x rotated (see docs/quantizers.md). Exposed for tests.
at::Tensor rotate_to(const at::Tensor& x, const at::Tensor& q);

}  // namespace lockstep::quant
