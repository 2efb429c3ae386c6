#include "lockstep/quant/vq.h"

#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {
// The reference's l2norm (F.normalize with eps 1e-6).
at::Tensor l2norm(const at::Tensor& t) {
  return torch::nn::functional::normalize(t, torch::nn::functional::NormalizeFuncOptions().dim(-1).eps(1e-6));
}

at::Generator or_default(const at::Generator& g) {
  return g.defined() ? g : at::detail::getDefaultCPUGenerator();
}

// `count` distinct rows of `samples` (n, d) when n >= count, else `count` rows with repeats, as the
// reference's sample_vectors.
at::Tensor sample_rows(const at::Tensor& samples, int64_t count, at::Generator generator) {
  const int64_t n = samples.size(0);
  const at::Tensor rows = n >= count ? torch::randperm(n, generator, torch::kInt64).narrow(0, 0, count)
                                     : torch::randint(0, n, {count}, generator, torch::kInt64);
  return samples.index_select(0, rows);
}

// Per-code token counts (K) and token sums (K, d) of tokens `flat` (n, d) assigned `indices` (n).
std::vector<at::Tensor> count_and_sum(const at::Tensor& flat, const at::Tensor& indices, int64_t k) {
  at::Tensor counts = torch::zeros({k}, torch::kFloat32).index_add_(0, indices, torch::ones({indices.size(0)}));
  at::Tensor sums = torch::zeros({k, flat.size(1)}, torch::kFloat32).index_add_(0, indices, flat);
  return {counts, sums};
}
}  // namespace

void VqOptions::validate() const {
  LOCKSTEP_CHECK_ARG(dim_ >= 1, "vq: dim = ", dim_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(codebook_size_ >= 1, "vq: codebook_size = ", codebook_size_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(decay_ >= 0 && decay_ < 1, "vq: decay = ", decay_, " must lie in [0, 1)");
  LOCKSTEP_CHECK_ARG(eps_ > 0, "vq: eps = ", eps_, " must be > 0");
  LOCKSTEP_CHECK_ARG(commitment_weight_ >= 0, "vq: commitment_weight = ", commitment_weight_, " must be >= 0");
  LOCKSTEP_CHECK_ARG(kmeans_iters_ >= 1, "vq: kmeans_iters = ", kmeans_iters_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(threshold_ema_dead_code_ >= 0, "vq: threshold_ema_dead_code = ", threshold_ema_dead_code_,
                     " must be >= 0");
}

Vq::Vq(VqOptions options, at::Generator generator) : Quantizer("Vq"), options_(std::move(options)) {
  options_.validate();
  metric_ = options_.use_cosine_sim() ? Metric::Cosine : Metric::Euclidean;
  const int64_t k = options_.codebook_size();
  const int64_t d = options_.dim();
  at::Tensor embed = torch::zeros({k, d});
  if (!options_.kmeans_init()) {
    // torch.nn.init.kaiming_uniform_ on (K, d): fan_in = d, gain sqrt(2), bound sqrt(6 / d).
    const double bound = std::sqrt(6.0 / static_cast<double>(d));
    embed.uniform_(-bound, bound, or_default(generator));
    if (options_.use_cosine_sim()) embed = l2norm(embed);
  }
  embed_ = register_buffer("embed", embed);
  cluster_size_ = register_buffer("cluster_size", torch::ones({k}));
  embed_avg_ = register_buffer("embed_avg", embed.clone());
  initted_ = register_buffer("initted", torch::tensor(options_.kmeans_init() ? 0.0f : 1.0f));
}

bool Vq::initted() const { return initted_.item<float>() > 0; }

at::Tensor Vq::prepare(const at::Tensor& x) const {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == options_.dim(), "vq: expected tokens (b, n, ", options_.dim(),
                     "), got ", x.sizes());
  const at::Tensor flat = x.to(torch::kFloat32).reshape({-1, options_.dim()});
  return options_.use_cosine_sim() ? l2norm(flat) : flat;
}

at::Tensor rotate_to(const at::Tensor& x, const at::Tensor& q) {
  const at::Tensor norm_x = x.norm(2, -1, true);
  const at::Tensor norm_q = q.norm(2, -1, true);
  const at::Tensor u = (x / norm_x.clamp_min(1e-6)).detach();
  const at::Tensor q_hat = (q / norm_q.clamp_min(1e-6)).detach();
  const at::Tensor w = l2norm(u + q_hat).detach();
  const at::Tensor rotated = x - 2 * (x * w).sum(-1, true) * w + 2 * (x * u).sum(-1, true) * q_hat;
  return rotated * (norm_q / norm_x.clamp_min(1e-6)).detach();
}

QuantizerOutput Vq::quantize(const at::Tensor& x, const QuantizeContext& ctx) {
  const at::Tensor tokens = prepare(x);
  const at::Tensor x_flat = x.to(torch::kFloat32).reshape({-1, options_.dim()});
  LocalReducer local;
  Reducer& reducer = ctx.reducer ? *ctx.reducer : local;
  if (is_training() && options_.kmeans_init() && !initted()) kmeans_init_from(tokens.detach(), ctx);

  const at::Tensor indices = nearest_code(tokens, embed_, metric_).indices;
  const at::Tensor q = embed_.index_select(0, indices);  // a copy: the EMA below changes embed_
  at::Tensor out = options_.estimator() == VqEstimator::RotationTrick ? rotate_to(x_flat, q)
                                                                      : x_flat + (q - x_flat).detach();
  QuantizerOutput result;
  // The commitment loss is reported in evaluation too (the reference returns 0 there).
  const at::Tensor commitment = x_flat.numel() > 0 ? torch::mse_loss(x_flat, q) : x_flat.sum() * 0;
  result.losses["commitment"] = commitment * options_.commitment_weight();
  if (is_training()) {
    torch::NoGradGuard no_grad;
    ema_update(tokens.detach(), indices, reducer);
    if (options_.threshold_ema_dead_code() > 0) expire_dead_codes(tokens.detach(), or_default(ctx.generator));
  }
  result.quantized = out.reshape(x.sizes()).to(x.scalar_type());
  result.indices = indices.reshape({x.size(0), x.size(1)});
  return result;
}

void Vq::kmeans_init_from(const at::Tensor& flat, const QuantizeContext& ctx) {
  torch::NoGradGuard no_grad;
  LocalReducer local;
  Reducer& reducer = ctx.reducer ? *ctx.reducer : local;
  const int64_t k = options_.codebook_size();
  // Issue #4 routes this sampling through the group (a gather, then one shared draw); for now each
  // holder samples its local batch with ctx.generator. A holder with no tokens keeps the current
  // (zero) codebook as its means but still joins every reduction.
  at::Tensor means = flat.size(0) > 0 ? sample_rows(flat, k, or_default(ctx.generator)) : embed_.clone();
  at::Tensor counts;
  for (int64_t iter = 0; iter < options_.kmeans_iters(); ++iter) {
    const at::Tensor assigned = nearest_code(flat, means, metric_).indices;
    std::vector<at::Tensor> stats = count_and_sum(flat, assigned, k);
    reducer.sum_(stats, "vq.kmeans");
    counts = stats[0];
    const at::Tensor empty = (counts == 0).unsqueeze(1);
    at::Tensor new_means = stats[1] / counts.clamp_min(1).unsqueeze(1);
    if (options_.use_cosine_sim()) new_means = l2norm(new_means);
    means = torch::where(empty, means, new_means);  // empty clusters keep their previous mean
  }
  if (counts.sum().item<float>() == 0) return;  // nobody held a token: try again next time
  embed_.copy_(means);
  cluster_size_.copy_(counts);
  embed_avg_.copy_(means * counts.unsqueeze(1));
  initted_.fill_(1.0f);
}

void Vq::ema_update(const at::Tensor& flat, const at::Tensor& indices, Reducer& reducer) {
  const int64_t k = options_.codebook_size();
  std::vector<at::Tensor> stats = count_and_sum(flat, indices, k);
  reducer.sum_(stats, "vq.ema");  // exactly once per training call, whatever the data
  const double weight = 1.0 - options_.decay();
  cluster_size_.lerp_(stats[0], weight);
  embed_avg_.lerp_(stats[1], weight);
  // Laplace smoothing keeps every code's size positive without changing the total.
  const at::Tensor total = cluster_size_.sum();
  const double eps = options_.eps();
  const at::Tensor smoothed = (cluster_size_ + eps) / (total + static_cast<double>(k) * eps) * total;
  at::Tensor embed = embed_avg_ / smoothed.unsqueeze(1);
  if (options_.use_cosine_sim()) embed = l2norm(embed);
  embed_.copy_(embed);
}

void Vq::expire_dead_codes(const at::Tensor& flat, at::Generator generator) {
  const double threshold = options_.threshold_ema_dead_code();
  const at::Tensor dead = (cluster_size_ < threshold).nonzero().squeeze(1);
  // Issue #4 samples these from the gathered global batch; locally, no tokens means no samples.
  if (dead.numel() == 0 || flat.size(0) == 0) return;
  const at::Tensor samples = sample_rows(flat, dead.numel(), generator);
  embed_.index_copy_(0, dead, samples);
  cluster_size_.index_fill_(0, dead, threshold);
  embed_avg_.index_copy_(0, dead, samples * threshold);
}

at::Tensor Vq::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  return nearest_code(prepare(x), embed_, metric_).indices.reshape({x.size(0), x.size(1)});
}

at::Tensor Vq::decode(const at::Tensor& indices) {
  LOCKSTEP_CHECK_ARG(indices.dim() == 2, "vq: expected indices (b, n), got ", indices.sizes());
  const int64_t k = options_.codebook_size();
  LOCKSTEP_CHECK_ARG(indices.numel() == 0 || (indices.min().item<int64_t>() >= 0 && indices.max().item<int64_t>() < k),
                     "vq: indices must lie in [0, ", k, ")");
  return embed_.index_select(0, indices.flatten().to(torch::kInt64))
      .reshape({indices.size(0), indices.size(1), options_.dim()});
}

}  // namespace lockstep::quant
