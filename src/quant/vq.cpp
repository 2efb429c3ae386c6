#include "lockstep/quant/vq.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>

#include "lockstep/core/error.h"
#include "lockstep/core/memory.h"
#include "lockstep/core/random.h"
#include "lockstep/quant/kmeans.h"
#include "torch_op_paths.h"
#include "vq_internal.h"

namespace lockstep::quant {
namespace vq_detail {
at::Tensor l2norm(const at::Tensor& t) {
  return torch::nn::functional::normalize(t, torch::nn::functional::NormalizeFuncOptions().dim(-1).eps(1e-6));
}

at::Generator or_default(const at::Generator& g) { return g.defined() ? g : at::detail::getDefaultCPUGenerator(); }

at::Tensor uniforms(uint64_t key, int64_t first, int64_t len, int64_t k, const at::TensorOptions& on) {
  if (on.device().is_cpu()) {
    at::Tensor u = torch::empty({len, k}, torch::kFloat32);
    float* p = u.data_ptr<float>();
    at::parallel_for(0, len, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const auto token = static_cast<uint64_t>(first + r);
        for (int64_t j = 0; j < k; ++j) p[r * k + j] = hashed_uniform(key, token * static_cast<uint64_t>(k) + j);
      }
    });
    return u;
  }
  const auto i64 = on.dtype(torch::kInt64);
  const at::Tensor tokens = torch::arange(first, first + len, i64).unsqueeze(1);
  return detail::hashed_uniform_torch(key, tokens * k + torch::arange(k, i64));
}
at::Tensor codes_with_token_gradient(const at::Tensor& t, const at::Tensor& q) {
  return t.requires_grad() ? q.detach() + (t - t.detach()) : q.detach();
}

void mask_topk(const at::Tensor& mask, VqTopk& result) {
  if (!mask.defined()) return;
  const at::Tensor padding = mask.logical_not();
  result.quantized = result.quantized.masked_fill(padding.reshape({mask.size(0), mask.size(1), 1, 1}), 0.0);
  result.indices = result.indices.masked_fill(padding.unsqueeze(2), -1);
  result.code_loss = result.code_loss.masked_fill(padding.unsqueeze(2), 0.0);
  result.distance = result.distance.masked_fill(padding.unsqueeze(2), 0.0);
}

at::Tensor ranked_distance(const at::Tensor& score, Metric metric, int64_t cd) {
  const at::Tensor squared = metric == Metric::Euclidean ? score : 2 - 2 * score;
  return squared / static_cast<double>(cd);
}
}  // namespace vq_detail

using vq_detail::codes_with_token_gradient;
using vq_detail::l2norm;
using vq_detail::mask_topk;
using vq_detail::or_default;
using vq_detail::ranked_distance;
using vq_detail::uniforms;

namespace {

// Standard normal draws (len, k) of (token, element) for tokens first..first+len-1: Box-Muller on two hashed
// uniforms each, so a token draws the same wherever it sits and whichever rank holds it.
at::Tensor gaussians(uint64_t key, int64_t first, int64_t len, int64_t k, const at::TensorOptions& on) {
  const at::Tensor u = uniforms(key, first, len, 2 * k, on).reshape({len, k, 2});
  return (-2 * u.select(2, 0).log()).sqrt() * torch::cos(2 * M_PI * u.select(2, 1));
}

// Gumbel-max draws of k codes per token from softmax(logits / temperature): the k largest of the
// perturbed logits, first of equal values first, so quantize's one draw is top-k's first. The logits
// are minus the Euclidean distance (the reference's cdist, clamped at 1e-8 before the root) or the
// cosine similarity, built from the nearest search's own values (code_scores): one distance for
// every path. Tokens in chunks so no (n, K) matrix is held whole. The noise of (token, code) is
// hashed from (key, the token's global index `first_token + row`, code), so a token draws the same
// wherever it sits in the batch and whichever rank holds it. Scores (n, k) as nearest_codes'.
NearestCode sample_codes(const at::Tensor& tokens, const at::Tensor& codebook, Metric metric, double temperature,
                         uint64_t key, int64_t first_token, int64_t k) {
  const int64_t n = tokens.size(0);
  const int64_t codes = codebook.size(0);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{8} << 20) / codes);  // 32 MiB of logits
  const auto on = tokens.options().dtype(torch::kFloat32);
  NearestCode out{torch::empty({n, k}, on.dtype(torch::kInt64)), torch::empty({n, k}, on)};
  const bool euclid = metric == Metric::Euclidean;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    const at::Tensor rows = tokens.narrow(0, start, len).to(torch::kFloat32);
    const at::Tensor values = code_scores(rows, codebook, metric);
    const at::Tensor squared = euclid ? rows.pow(2).sum(1, true) + values : at::Tensor();
    const at::Tensor logits = euclid ? -squared.clamp_min(1e-8).sqrt() : values.neg();
    const at::Tensor u = uniforms(key, first_token + start, len, codes, logits.options());
    const at::Tensor gumbel = -(-(u.log())).log();
    const at::Tensor index = smallest_first((logits / temperature + gumbel).neg(), k);
    out.indices.narrow(0, start, len).copy_(index);
    out.score.narrow(0, start, len)
        .copy_(euclid ? squared.gather(1, index).clamp_min(0) : values.gather(1, index).neg());
  }
  return out;
}
}  // namespace

void VqOptions::validate() const {
  check_fields("vq", *this);
  LOCKSTEP_CHECK_ARG(dim_ >= 1, "vq: dim = ", dim_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(codebook_size_ >= 1, "vq: codebook_size = ", codebook_size_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(codebook_dim() >= 1, "vq: codebook_dim = ", codebook_dim(), " must be >= 1");
  LOCKSTEP_CHECK_ARG(!(learnable_codebook_ && ema_update_),
                     "vq: learnable_codebook = true needs ema_update = false (the codebook is learned by gradient or "
                     "by the EMA, not both)");
  LOCKSTEP_CHECK_ARG(!(learnable_codebook_ && use_cosine_sim_),
                     "vq: learnable_codebook = true needs cosine = false (as in vector-quantize-pytorch)");
  LOCKSTEP_CHECK_ARG(!(affine_param_ && use_cosine_sim_),
                     "vq: affine_param = true needs cosine = false (as in vector-quantize-pytorch)");
  if (estimator() == VqEstimator::DirectionalReparam) {  // as the reference asserts
    LOCKSTEP_CHECK_ARG(threshold_ema_dead_code_ > 0,
                       "vq: directional_reparam needs dead-code replacement (threshold_ema_dead_code > 0)");
  }
  LOCKSTEP_CHECK_ARG(sync_update_v_ == 0 || learnable_codebook_, "vq: sync_update_v > 0 needs learnable_codebook");
  LOCKSTEP_CHECK_ARG(!(orthogonal_reg_active_codes_only_ && separate_codebook_per_head_ && heads_ > 1),
                     "vq: orthogonal_reg_active_codes_only needs one codebook (not separate_codebook_per_head), as in "
                     "vector-quantize-pytorch");
}

Vq::Vq(VqOptions options, at::Generator generator) : Quantizer("Vq"), options_(std::move(options)) {
  options_.validate();
  metric_ = options_.use_cosine_sim() ? Metric::Cosine : Metric::Euclidean;
  const int64_t k = options_.codebook_size();
  const int64_t cd = options_.codebook_dim();
  const int64_t codebooks = options_.num_codebooks();
  if (options_.heads() * cd != options_.dim()) {
    if (options_.layernorm_after_project_in()) {
      project_in_ = torch::nn::Linear(options_.dim(), options_.heads() * cd);
      project_in_normed_ = register_module(
          "project_in", torch::nn::Sequential(
                            project_in_, torch::nn::LayerNorm(torch::nn::LayerNormOptions({options_.heads() * cd}))));
    } else {
      project_in_ = register_module("project_in", torch::nn::Linear(options_.dim(), options_.heads() * cd));
    }
    project_out_ = register_module("project_out", torch::nn::Linear(options_.heads() * cd, options_.dim()));
  }
  // embed, embed_avg and their working copies: about four (C, K, cd) float tensors.
  check_fits_in_memory(
      4.0 * 4 * static_cast<double>(codebooks) * static_cast<double>(k) * static_cast<double>(cd),
      ::lockstep::detail::concat("vq: ", codebooks, " codebook(s) of ", k, " codes of dimension ", cd));
  at::Tensor embed = torch::zeros({codebooks, k, cd});
  if (!options_.kmeans_init()) {
    // The reference draws kaiming_uniform_ on a (C, K, cd) tensor, whose fan_in torch counts as
    // K * cd (size(1) times the trailing sizes) whatever C: bound sqrt(6 / (K * cd)).
    const double bound = std::sqrt(6.0 / static_cast<double>(k * cd));
    embed.uniform_(-bound, bound, or_default(generator));
    if (options_.use_cosine_sim()) embed = l2norm(embed);
  }
  // Learned by gradient, or with the orthogonal regulariser trained by it beside the EMA, the codebook
  // is a parameter, as in the reference; otherwise a buffer the EMA owns.
  embed_ = options_.codebook_is_parameter() ? register_parameter("embed", embed) : register_buffer("embed", embed);
  cluster_size_ = register_buffer("cluster_size", torch::ones({codebooks, k}));
  // Detached: register_parameter made embed require a gradient, and a buffer with a graph cannot be deep-copied.
  embed_avg_ = register_buffer("embed_avg", embed.detach().clone());
  initted_ = register_buffer("initted", torch::tensor(options_.kmeans_init() ? 0.0f : 1.0f));
  if (options_.affine_param()) {
    batch_mean_ = register_buffer("batch_mean", torch::zeros({codebooks, 1, cd}));
    batch_variance_ = register_buffer("batch_variance", torch::ones({codebooks, 1, cd}));
    codebook_mean_ = register_buffer("codebook_mean", torch::zeros({codebooks, 1, cd}));
    codebook_variance_ = register_buffer("codebook_variance", torch::ones({codebooks, 1, cd}));
    affine_initted_ = register_buffer("affine_initted", torch::tensor(0.0f));
  }
}

namespace {
// A standard deviation from an EMA of a variance, floored as the reference floors it.
at::Tensor std_of(const at::Tensor& variance) { return variance.clamp_min(1e-5).sqrt(); }
}  // namespace

at::Tensor Vq::searched_codebook(const at::Tensor& bridged) const {
  if (bridged.defined()) {
    LOCKSTEP_CHECK_ARG(bridged.sizes() == embed_.sizes() && bridged.is_floating_point(),
                       "vq: the vq_bridge must give a codebook of the shape it takes, ", embed_.sizes(), ", got ",
                       bridged.sizes(), " of ", bridged.scalar_type());
  }
  const at::Tensor codes =
      bridged.defined() ? bridged.to(torch::kFloat32) : (options_.learnable_codebook() ? embed_ : embed_.detach());
  const at::Tensor scale = affine_scale();
  if (!scale.defined()) return codes;
  return (codes - codebook_mean_) * scale + batch_mean_;
}

at::Tensor Vq::affine_scale() const {
  if (!options_.affine_param() || affine_initted_.item<float>() == 0) return {};
  return std_of(batch_variance_) / std_of(codebook_variance_);
}

at::Tensor Vq::in_codebook_frame(const at::Tensor& tokens) const {
  if (affine_initted_.item<float>() == 0) return tokens;
  return (tokens - batch_mean_) * (std_of(codebook_variance_) / std_of(batch_variance_)) + codebook_mean_;
}

void Vq::update_affine(const at::Tensor& tokens, Reducer& reducer) {
  // The global batch's per-dimension count, sum and sum of squares (float64), in one transfer.
  const at::Tensor t = tokens.to(torch::kDouble);  // (C, M, cd)
  std::vector<at::Tensor> sums = {torch::full({t.size(0), 1, 1}, static_cast<double>(t.size(1)), t.options()),
                                  t.sum(1, true), t.pow(2).sum(1, true)};
  reducer.sum_(sums, LOCKSTEP_CALL_SITE("vq.affine"));
  const at::Tensor count = sums[0].clamp_min(1);
  const at::Tensor mean = sums[1] / count;
  const at::Tensor variance = (sums[2] / count - mean.pow(2)).clamp_min(0);  // biased, as the reference's
  const at::Tensor codes = embed_.detach();
  const at::Tensor code_mean = codes.mean(1, true);
  const at::Tensor code_variance = codes.var(1, /*unbiased=*/false, /*keepdim=*/true);
  const bool first = affine_initted_.item<float>() == 0;
  const auto fold = [first](at::Tensor& ema, const at::Tensor& value, double decay) {
    if (first) {
      ema.copy_(value);
    } else {
      ema.mul_(decay).add_(value.to(ema.scalar_type()) * (1 - decay));
    }
  };
  // A batch without tokens anywhere leaves the batch statistics (the reference's mean would be NaN).
  if (sums[0].min().item<double>() > 0) {
    fold(batch_mean_, mean, options_.affine_param_batch_decay());
    fold(batch_variance_, variance, options_.affine_param_batch_decay());
  } else if (first) {
    return;  // nothing to start from yet: the next call tries again
  }
  fold(codebook_mean_, code_mean, options_.affine_param_codebook_decay());
  fold(codebook_variance_, code_variance, options_.affine_param_codebook_decay());
  affine_initted_.fill_(1.0f);
}

bool Vq::initted() const { return initted_.item<float>() > 0; }

at::Tensor Vq::group_by_codebook(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == options_.dim(), "vq: expected tokens (b, n, ", options_.dim(),
                     "), got ", x.sizes());
  at::Tensor z = x.to(torch::kFloat32);
  if (project_in_normed_) {
    z = project_in_normed_->forward(z);
  } else if (project_in_) {
    z = project_in_->forward(z);
  }
  const int64_t heads = options_.heads();
  const int64_t cd = options_.codebook_dim();
  z = z.reshape({x.size(0), x.size(1), heads, cd});
  // Shared codebook: every head vector is one more token; separate: head h goes to codebook h.
  if (!options_.separate_codebook_per_head()) return z.reshape({1, -1, cd});
  return z.permute({2, 0, 1, 3}).reshape({heads, -1, cd});
}

at::Tensor Vq::ungroup(const at::Tensor& grouped, int64_t b, int64_t n) {
  const int64_t heads = options_.heads();
  const int64_t cd = options_.codebook_dim();
  at::Tensor z = options_.separate_codebook_per_head()
                     ? grouped.reshape({heads, b, n, cd}).permute({1, 2, 0, 3}).reshape({b, n, heads * cd})
                     : grouped.reshape({b, n, heads * cd});
  return project_out_ ? project_out_->forward(z) : z;
}

at::Tensor Vq::ungroup_indices(const at::Tensor& indices, int64_t b, int64_t n) const {
  const int64_t heads = options_.heads();
  const at::Tensor per_head = options_.separate_codebook_per_head() ? indices.reshape({heads, b, n}).permute({1, 2, 0})
                                                                    : indices.reshape({b, n, heads});
  return heads == 1 ? per_head.reshape({b, n}) : per_head.contiguous();
}

at::Tensor Vq::prepare(const at::Tensor& grouped) const {
  return options_.use_cosine_sim() ? l2norm(grouped) : grouped;
}

double Vq::temperature(const QuantizeContext& ctx) const {
  return ctx.sample_codebook_temp.value_or(options_.sample_codebook_temp());
}

bool Vq::samples(const QuantizeContext& ctx) const {
  return is_training() && options_.stochastic_sample_codes() && temperature(ctx) > 0;
}

at::Tensor Vq::assign(const at::Tensor& tokens, const at::Tensor& codebook, const at::Generator& generator,
                      double temperature, int64_t first_token) const {
  torch::NoGradGuard no_grad;  // a learnable codebook's search builds no graph
  uint64_t key = 0;
  if (generator.defined()) {        // one draw per call, the same on every rank
    at::Generator gen = generator;  // a handle: draws advance the caller's generator
    std::lock_guard<std::mutex> lock(gen.mutex());
    key = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
  }
  std::vector<at::Tensor> per_codebook;
  for (int64_t c = 0; c < tokens.size(0); ++c) {
    per_codebook.push_back(generator.defined() ? sample_codes(tokens[c], codebook[c], metric_, temperature,
                                                              mix64(key + static_cast<uint64_t>(c)), first_token, 1)
                                                     .indices.select(1, 0)
                                               : nearest_code(tokens[c], codebook[c], metric_).indices);
  }
  return torch::stack(per_codebook);
}

at::Tensor directional_reparam(const at::Tensor& t, const at::Tensor& q, double variance,
                               const at::Generator& generator, int64_t first_token) {
  uint64_t key = 0;
  {
    at::Generator gen = generator.defined() ? generator : at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());  // a handle: the draw advances the caller's generator
    key = mix64(at::check_generator<at::CPUGeneratorImpl>(gen)->random64() ^ 0xD17E0ULL);
  }
  const at::Tensor error = q - t;
  const at::Tensor noise = gaussians(key, first_token, t.size(0), t.size(1), t.options());
  const at::Tensor unit = l2norm(error.detach() + std::sqrt(variance) * noise);
  return t + unit * error.norm(2, -1, true);
}

at::Tensor Vq::estimated(const at::Tensor& t, const at::Tensor& q, const at::Generator& generator,
                         int64_t first_token) const {
  if (!options_.route_gradients_to_input()) return q;  // the codes themselves (a learned codebook's gradient)
  at::Tensor out;
  switch (options_.estimator()) {
    case VqEstimator::RotationTrick:
      out = rotate_to(t, q);
      break;
    case VqEstimator::DirectionalReparam:
      out = directional_reparam(t, q, options_.directional_reparam_variance(), generator, first_token);
      break;
    case VqEstimator::StraightThrough:
      out = t + (q - t).detach();
      break;
  }
  const double v = options_.sync_update_v();
  return v > 0 ? out + v * (out - out.detach()) : out;
}

at::Tensor Vq::lookup(const at::Tensor& codebook, const at::Tensor& indices) {
  if (indices.size(0) == 1) return codebook[0].index_select(0, indices[0]).unsqueeze(0);
  std::vector<at::Tensor> per_codebook;
  for (int64_t c = 0; c < indices.size(0); ++c) per_codebook.push_back(codebook[c].index_select(0, indices[c]));
  return torch::stack(per_codebook);  // a copy: the EMA update changes embed_ afterwards
}

namespace {
// sum_ij cos(e_i, e_j)^2 / (C K^2) - 1/K for codebooks (C, K, cd); |N^T N|_F^2 for the normalised
// codes N (K, cd) is that sum in O(K cd^2), with no K x K matrix.
at::Tensor orthogonal_loss_of(const at::Tensor& embed) {
  const at::Tensor normed = l2norm(embed);
  const at::Tensor gram = torch::matmul(normed.transpose(1, 2), normed);
  const auto k = static_cast<double>(embed.size(1));
  return gram.pow(2).sum() / (static_cast<double>(embed.size(0)) * k * k) - 1.0 / k;
}

// `codes` (int64, undefined for all): the ids of the codes the regulariser takes.
at::Tensor orthogonal_loss_of(const at::Tensor& embed, const at::Tensor& codes) {
  return orthogonal_loss_of(codes.defined() ? embed.index_select(1, codes) : embed);
}

// The regulariser of a codebook parameter whose backward differentiates at the codebook's values
// then: a deferred EMA update (run in backward, before this node) has moved it by then, and the
// reference differentiates at the updated codebook. Nothing is saved, so the update is allowed.
// `codes` (none, or the ids) stays out of apply()'s tensor arguments, which must be defined.
struct OrthogonalLoss : public torch::autograd::Function<OrthogonalLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& embed,
                            const std::vector<at::Tensor>& codes) {
    ctx->saved_data["embed"] = embed;  // the live parameter, read again in backward
    ctx->saved_data["codes"] = codes;
    torch::NoGradGuard no_grad;
    return orthogonal_loss_of(embed.detach(), codes.empty() ? at::Tensor() : codes[0]);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor now = ctx->saved_data["embed"].toTensor().detach().requires_grad_(true);
    const auto codes = ctx->saved_data["codes"].toTensorVector();
    at::Tensor value;
    {
      torch::AutoGradMode enabled(true);
      value = orthogonal_loss_of(now, codes.empty() ? at::Tensor() : codes[0]);
    }
    return {torch::autograd::grad({value}, {now}, {grads[0]})[0], at::Tensor()};
  }
};
}  // namespace

at::Tensor Vq::orthogonal_codes(const at::Tensor& counted_indices, const QuantizeContext& ctx) const {
  at::Tensor codes;
  if (options_.orthogonal_reg_active_codes_only()) codes = std::get<0>(at::_unique(counted_indices.reshape(-1)));
  const int64_t available = codes.defined() ? codes.numel() : embed_.size(1);
  const int64_t most = options_.orthogonal_reg_max_codes();
  if (most > 0 && available > most) {
    // A copy of the call's generator: the same draw on every rank, and the call's other draws unchanged.
    at::Generator generator = ctx.generator.defined() ? ctx.generator.clone() : or_default(ctx.generator);
    const at::Tensor picked = torch::randperm(available, generator, torch::kLong).slice(0, 0, most).to(embed_.device());
    codes = codes.defined() ? codes.index_select(0, picked) : picked;
  }
  return codes;
}

at::Tensor Vq::orthogonal_loss(const at::Tensor& counted_indices, const QuantizeContext& ctx) const {
  const at::Tensor codes = orthogonal_codes(counted_indices, ctx);
  // No token counted, so no active code: no regulariser (the reference's is NaN there).
  if (codes.defined() && codes.numel() == 0) return embed_.sum() * 0.0;
  const std::vector<at::Tensor> taken = codes.defined() ? std::vector<at::Tensor>{codes} : std::vector<at::Tensor>{};
  return OrthogonalLoss::apply(embed_, taken) * options_.orthogonal_reg_weight();
}

QuantizerOutput Vq::quantize(const at::Tensor& x, const QuantizeContext& ctx) { return quantize_with(x, ctx, {}); }

void Vq::initialise(const at::Tensor& x, const QuantizeContext& ctx) {
  const bool may_change_state = ctx.may_change_state(is_training());
  if (!may_change_state || !options_.kmeans_init() || initted()) return;
  torch::NoGradGuard no_grad;
  at::Tensor tokens = prepare(group_by_codebook(x));
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  if (mask.defined()) {  // the counted tokens' positions along M, as quantize_with takes them
    const int64_t per_token = options_.separate_codebook_per_head() ? 1 : options_.heads();
    const int64_t tokens_in_batch = mask.numel();
    tokens = tokens.index_select(
        1, mask.reshape({tokens_in_batch, 1}).expand({tokens_in_batch, per_token}).reshape(-1).nonzero().squeeze(1));
  }
  kmeans_init_from(tokens, ctx);
}

QuantizerOutput Vq::quantize_with(const at::Tensor& x, const QuantizeContext& ctx, const VqUpdate& call) {
  const int64_t b = x.size(0);
  const int64_t n = x.dim() == 3 ? x.size(1) : 0;
  // (C, M, cd), differentiable; of unit length under cosine similarity, so that the commitment loss
  // and the straight-through output are taken there, as the reference takes them.
  const at::Tensor grouped = prepare(group_by_codebook(x));
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  // Positions (along M) of the tokens that count; a masked token enters no statistic and no loss.
  at::Tensor counted;
  if (mask.defined()) {
    const int64_t per_token = options_.separate_codebook_per_head() ? 1 : options_.heads();
    counted = mask.reshape({b * n, 1}).expand({b * n, per_token}).reshape(-1).nonzero().squeeze(1);
  }
  const auto only_counted = [&](const at::Tensor& t) { return counted.defined() ? t.index_select(1, counted) : t; };
  const at::Tensor tokens = grouped.detach();
  const at::Tensor counted_tokens = only_counted(tokens);
  // Deferred (the Python modules): a call that cannot be backwarded changes no state, k-means included.
  const bool may_change_state = ctx.may_change_state(is_training());
  if (may_change_state && options_.kmeans_init() && !initted()) kmeans_init_from(counted_tokens, ctx);

  const int64_t tokens_per_item = b > 0 ? tokens.size(1) / b : 0;
  const at::Tensor codebook = searched_codebook(ctx.codebook);
  const at::Tensor indices = assign(tokens, codebook, samples(ctx) ? or_default(ctx.generator) : at::Generator(),
                                    temperature(ctx), ctx.first_item * tokens_per_item);
  const at::Tensor q = lookup(codebook, indices);
  const int64_t cd = options_.codebook_dim();
  at::Tensor out;
  if (!is_training() && !options_.route_gradients_to_input()) {
    out = q;  // the codes, a learned codebook's gradient only, as in training (and the reference's evaluation)
  } else if (!is_training()) {
    out = codes_with_token_gradient(grouped, q);
  } else {
    out = estimated(grouped.reshape({-1, cd}), q.reshape({-1, cd}), or_default(ctx.generator),
                    ctx.first_item * tokens_per_item)
              .reshape(grouped.sizes());
  }
  QuantizerOutput result;
  // The commitment loss is reported in evaluation too (the reference returns 0 there); the mean
  // over the tokens that count, 0 when none does.
  const at::Tensor counted_grouped = only_counted(grouped);
  // A learnable codebook is trained by this loss (the codes not detached), as the reference's.
  const at::Tensor codes =
      options_.learnable_codebook() && !ctx.freeze_codebook ? only_counted(q) : only_counted(q).detach();
  const at::Tensor commitment =
      counted_grouped.numel() > 0 ? torch::mse_loss(counted_grouped, codes) : grouped.sum() * 0;
  // DiVeQ has none, as the reference (its estimator pulls the codes to the tokens).
  result.losses["commitment"] = commitment * (options_.has_commitment_loss() ? options_.commitment_weight() : 0.0);
  if (is_training() && options_.codebook_diversity_loss_weight() > 0) {
    // A copy of a codebook not learned: the EMA update in backward writes embed before this loss's backward reads it.
    const at::Tensor base = ctx.codebook.defined()          ? ctx.codebook
                            : options_.learnable_codebook() ? embed_
                                                            : embed_.detach().clone();
    result.losses["diversity"] = diversity_loss(code_logits(x, base), mask) * options_.codebook_diversity_loss_weight();
  }
  // The affine statistics follow every training call, frozen codebook or not, as the reference's.
  // The in-place gradient first: it is taken at the codes searched, which the EMA's refresh overwrites.
  std::function<void(Reducer&)> in_place;
  if (may_change_state && keep_in_place_gradient_ && !ctx.freeze_codebook) {
    const at::Tensor counted_codes = only_counted(q).detach();
    result.losses["in_place"] =
        counted_tokens.numel() > 0 ? torch::mse_loss(counted_codes, counted_tokens) : tokens.sum() * 0;
    in_place = in_place_update(counted_tokens, only_counted(indices), codebook.detach(), affine_scale());
    if (!ctx.defer_updates) {
      LocalReducer local;
      in_place(ctx.reducer ? *ctx.reducer : local);
      in_place = {};
    }
  }
  if (may_change_state) result.update = state_update(counted_tokens, only_counted(indices), ctx, true, call);
  if (in_place && result.update) {
    result.update = [in_place, then = std::move(result.update)](Reducer& r) {
      in_place(r);
      then(r);
    };
  } else if (in_place) {
    result.update = std::move(in_place);
  }
  // Of the codebook as this call left it, as the reference reports it; with deferred updates, of the
  // codebook before the update (its gradient is still taken at the updated codebook: OrthogonalLoss).
  if (options_.orthogonal_reg_weight() > 0) {
    result.losses["orthogonal"] = orthogonal_loss(only_counted(indices), ctx);
    // Codes drawn each step: the step advances (with the update) even where the call changes no state.
    if (may_change_state && ctx.defer_updates && !result.update && options_.orthogonal_reg_max_codes() > 0) {
      result.update = [](Reducer&) {};
    }
  }
  result.quantized = ungroup(out, b, n).to(x.scalar_type());
  result.indices = ungroup_indices(indices, b, n);
  apply_mask(mask, result.quantized, result.indices);
  return result;
}

// nearest_codes, or sample_codes with the key quantize's assign() draws for codebook 0 (the same
// noise): the same values and order as quantize's search, so the first of the k is quantize's code.
NearestCode Vq::topk_codes(const at::Tensor& tokens, const at::Tensor& codebook, int64_t k,
                           const at::Generator& generator, double temperature, int64_t first_token) const {
  torch::NoGradGuard no_grad;
  if (!generator.defined()) return nearest_codes(tokens, codebook, metric_, k);
  uint64_t key = 0;
  {
    at::Generator gen = generator;
    std::lock_guard<std::mutex> lock(gen.mutex());
    key = mix64(at::check_generator<at::CPUGeneratorImpl>(gen)->random64());
  }
  return sample_codes(tokens, codebook, metric_, temperature, key, first_token, k);
}

VqTopk Vq::quantize_topk(const at::Tensor& x, int64_t k, const QuantizeContext& ctx) {
  LOCKSTEP_CHECK_ARG(options_.heads() == 1,
                     "vq: top-k codes need heads = 1 (as the reference's), got heads = ", options_.heads());
  LOCKSTEP_CHECK_ARG(k >= 1, "vq: top-k takes k >= 1, got ", k);
  k = std::min(k, options_.codebook_size());
  const at::Tensor grouped = prepare(group_by_codebook(x));  // (1, M, cd)
  const int64_t b = x.size(0);
  const int64_t n = x.size(1);
  const int64_t m = grouped.size(1);
  const int64_t cd = options_.codebook_dim();
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  const at::Tensor tokens = grouped.detach();
  const at::Tensor counted_tokens =
      mask.defined() ? tokens.index_select(1, mask.reshape(-1).nonzero().squeeze(1)) : tokens;
  const bool may_change_state = ctx.may_change_state(is_training());
  if (may_change_state && options_.kmeans_init() && !initted()) kmeans_init_from(counted_tokens, ctx);
  const at::Tensor codebook = searched_codebook(ctx.codebook)[0];  // (K, cd), differentiable when learned
  const NearestCode top = topk_codes(tokens[0], codebook, k, samples(ctx) ? or_default(ctx.generator) : at::Generator(),
                                     temperature(ctx), ctx.first_item * n);
  const at::Tensor& indices = top.indices;
  const at::Tensor q = codebook.index_select(0, indices.reshape(-1)).reshape({m, k, cd});
  const at::Tensor token = grouped[0].unsqueeze(1).expand({m, k, cd});
  at::Tensor out;
  if (!is_training()) {
    out = codes_with_token_gradient(token, q);
  } else {
    out = estimated(token.reshape({-1, cd}), q.reshape({-1, cd}), or_default(ctx.generator), ctx.first_item * n * k)
              .reshape({m, k, cd});
  }
  VqTopk result;
  const at::Tensor codes = options_.learnable_codebook() && !ctx.freeze_codebook ? q : q.detach();
  result.code_loss = (token - codes).pow(2).mean(-1).reshape({b, n, k});
  result.distance = ranked_distance(top.score, metric_, cd).reshape({b, n, k});
  if (options_.orthogonal_reg_weight() > 0) {
    const at::Tensor counted =
        mask.defined() ? indices.index_select(0, mask.reshape(-1).nonzero().squeeze(1)) : indices;
    result.losses["orthogonal"] = orthogonal_loss(counted, ctx);
  }
  // The affine statistics follow the call, as the reference's codebook forward updates them.
  if (may_change_state && options_.affine_param()) {
    auto update = [this, counted_tokens](Reducer& r) {
      torch::NoGradGuard no_grad;
      update_affine(counted_tokens, r);
    };
    if (ctx.defer_updates) {
      result.update = std::move(update);
    } else {
      LocalReducer local;
      update(ctx.reducer ? *ctx.reducer : local);
    }
  }
  if (project_out_) out = project_out_->forward(out);
  result.quantized = out.reshape({b, n, k, options_.dim()}).to(x.scalar_type());
  result.indices = indices.reshape({b, n, k});
  mask_topk(mask, result);
  return result;
}

at::Tensor Vq::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  const at::Tensor tokens = prepare(group_by_codebook(x));
  return ungroup_indices(assign(tokens, searched_codebook(), at::Generator(), 0.0, 0), x.size(0), x.size(1));
}

at::Tensor Vq::code_logits(const at::Tensor& x, const at::Tensor& bridged) {
  const at::Tensor tokens = prepare(group_by_codebook(x));  // (C, M, cd)
  const at::Tensor codes = searched_codebook(bridged);
  const at::Tensor dots = torch::matmul(tokens, codes.transpose(1, 2));  // (C, M, K)
  at::Tensor logits = dots;
  if (!options_.use_cosine_sim()) {  // the reference's cdist: sqrt(max(|x|^2 + |e|^2 - 2 x.e, 0))
    const at::Tensor squared = tokens.pow(2).sum(-1, true) + codes.pow(2).sum(-1).unsqueeze(1) - 2 * dots;
    logits = -squared.clamp_min(0).sqrt();
  }
  const int64_t b = x.size(0), n = x.size(1), heads = options_.heads(), k = options_.codebook_size();
  const at::Tensor per_head = options_.separate_codebook_per_head()
                                  ? logits.reshape({heads, b, n, k}).permute({1, 2, 0, 3})
                                  : logits.reshape({b, n, heads, k});
  return heads == 1 ? per_head.reshape({b, n, k}) : per_head;
}

at::Tensor Vq::diversity_loss(const at::Tensor& logits, const at::Tensor& mask) const {
  at::Tensor probs = (logits * options_.codebook_diversity_temperature()).softmax(-1);
  if (probs.dim() == 3) probs = probs.unsqueeze(2);  // (b, n, heads, K)
  const at::Tensor weights =
      mask.defined() ? mask.to(probs.scalar_type()) : torch::ones({probs.size(0), probs.size(1)}, probs.options());
  const at::Tensor counted = weights.sum(0) * static_cast<double>(probs.size(2));  // (n)
  const at::Tensor average = (probs * weights.unsqueeze(-1).unsqueeze(-1)).sum(std::vector<int64_t>{0, 2}) /
                             counted.clamp_min(1).unsqueeze(1);                   // (n, K)
  const at::Tensor entropy = (-average * average.clamp_min(1e-5).log()).sum(-1);  // the reference's eps
  const at::Tensor present = (counted > 0).to(entropy.scalar_type());
  return -(entropy * present).sum() / present.sum().clamp_min(1);
}

at::Tensor Vq::decode(const at::Tensor& indices) {
  const int64_t heads = options_.heads();
  LOCKSTEP_CHECK_ARG(heads == 1 ? indices.dim() == 2 : (indices.dim() == 3 && indices.size(2) == heads),
                     "vq: expected indices ", heads == 1 ? "(b, n)" : lockstep::detail::concat("(b, n, ", heads, ")"),
                     ", got ", indices.sizes());
  const int64_t k = options_.codebook_size();
  LOCKSTEP_CHECK_ARG(indices.numel() == 0 || (indices.min().item<int64_t>() >= 0 && indices.max().item<int64_t>() < k),
                     "vq: indices must lie in [0, ", k, ")");
  const int64_t b = indices.size(0);
  const int64_t n = indices.size(1);
  const at::Tensor per_head = indices.to(torch::kInt64).reshape({b, n, heads});
  // Back to the (C, M) layout quantize uses, then the same lookup and projection.
  const at::Tensor grouped = options_.separate_codebook_per_head() ? per_head.permute({2, 0, 1}).reshape({heads, -1})
                                                                   : per_head.reshape({1, -1});
  return ungroup(lookup(searched_codebook(), grouped), b, n);
}

}  // namespace lockstep::quant

namespace lockstep::quant::detail {
namespace {
// x >> s without sign extension (torch shifts int64 arithmetically).
at::Tensor shift_right(const at::Tensor& x, int s) {
  return x.__rshift__(s).bitwise_and(static_cast<int64_t>((~uint64_t{0}) >> s));
}

at::Tensor mix64_torch(at::Tensor x) {  // mix64, in int64 arithmetic that wraps as uint64 would
  x = x + static_cast<int64_t>(0x9E3779B97F4A7C15ULL);
  x = x.bitwise_xor(shift_right(x, 30)) * static_cast<int64_t>(0xBF58476D1CE4E5B9ULL);
  x = x.bitwise_xor(shift_right(x, 27)) * static_cast<int64_t>(0x94D049BB133111EBULL);
  return x.bitwise_xor(shift_right(x, 31));
}
}  // namespace

at::Tensor hashed_uniform_torch(uint64_t key, const at::Tensor& counters) {
  LOCKSTEP_CHECK_ARG(counters.scalar_type() == torch::kInt64, "hashed_uniform_torch: counters must be int64, got ",
                     counters.scalar_type());
  const at::Tensor h = mix64_torch(mix64_torch(counters).bitwise_xor(static_cast<int64_t>(key)));
  return (shift_right(h, 40).to(torch::kFloat32) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace lockstep::quant::detail
