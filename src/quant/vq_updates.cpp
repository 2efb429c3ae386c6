// Vq's state updates: the EMA of the codes' statistics, k-means initialisation, dead-code replacement and
// the deferred updates a training call hands back (quantize and search are vq.cpp's).
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/core/random.h"
#include "lockstep/quant/kmeans.h"
#include "lockstep/quant/vq.h"
#include "vq_internal.h"

namespace lockstep::quant {
namespace {
// `count` distinct rows of `samples` (n, d) when n >= count, else `count` rows with repeats, as the
// reference's sample_vectors.
at::Tensor sample_rows(const at::Tensor& samples, int64_t count, at::Generator generator) {
  const int64_t n = samples.size(0);
  const at::Tensor rows = n >= count ? torch::randperm(n, generator, torch::kInt64).narrow(0, 0, count)
                                     : torch::randint(0, n, {count}, generator, torch::kInt64);
  return samples.index_select(0, rows.to(samples.device()));  // drawn on the host: the same on every device
}

// (C, M, cd) tokens of this holder -> (C, M_total, cd) of the global batch, in batch order.
at::Tensor gather_tokens(const at::Tensor& tokens, Reducer& reducer, const CallSite& site) {
  return reducer.gather(tokens.transpose(0, 1).contiguous(), site).transpose(0, 1).contiguous();
}

}  // namespace

using vq_detail::l2norm;
using vq_detail::or_default;

std::function<void(Reducer&)> Vq::state_update(const at::Tensor& tokens, const at::Tensor& indices,
                                               const QuantizeContext& ctx, bool affine, const VqUpdate& call) {
  affine = affine && options_.affine_param();
  // Without the EMA and dead codes a call keeps no statistics: no update, no collective.
  const bool ema = call.ema_update.value_or(options_.ema_update());
  const bool trains_codebook = (ema || options_.threshold_ema_dead_code() > 0) && !ctx.freeze_codebook;
  if (!trains_codebook && !affine) return {};
  VqUpdate per_call = call;
  per_call.ema_update = ema;
  // Captures the call's counted tokens and assignments; `this` must outlive a deferred update.
  auto update = [this, trains_codebook, affine, tokens, indices, generator = or_default(ctx.generator),
                 per_call](Reducer& r) {
    torch::NoGradGuard no_grad;
    // The statistics first, then the EMA of the tokens moved into the codebooks' frame with them
    // (dead codes are replaced by tokens as they come, as the reference's).
    if (affine) update_affine(tokens, r);
    if (!trains_codebook) return;
    ema_update(options_.affine_param() ? in_codebook_frame(tokens) : tokens, indices, r, per_call);
    // An accumulating call leaves dead codes too, as the reference's; only training replaces them.
    if (!per_call.accumulate && options_.threshold_ema_dead_code() > 0 && is_training()) {
      expire_dead_codes(tokens, r, generator);
    }
  };
  if (ctx.defer_updates) return update;
  LocalReducer local;
  update(ctx.reducer ? *ctx.reducer : local);
  return {};
}

std::function<void(Reducer&)> Vq::refresh_update(const at::Tensor& x, const QuantizeContext& ctx) {
  torch::NoGradGuard no_grad;
  const bool dead_codes = options_.threshold_ema_dead_code() > 0 && is_training();
  if (ctx.freeze_codebook || (!options_.ema_update() && !dead_codes)) return {};
  at::Tensor tokens = prepare(group_by_codebook(x)).detach();  // (C, M, cd)
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  if (mask.defined()) {
    const int64_t per_token = options_.separate_codebook_per_head() ? 1 : options_.heads();
    tokens = tokens.index_select(
        1, mask.reshape({-1, 1}).expand({mask.numel(), per_token}).reshape(-1).nonzero().squeeze(1));
  }
  auto update = [this, tokens, dead_codes, generator = or_default(ctx.generator)](Reducer& r) {
    torch::NoGradGuard no_grad;
    if (options_.ema_update() && !options_.manual_ema_update()) refresh_codebook();
    if (dead_codes) expire_dead_codes(tokens, r, generator);
  };
  if (ctx.defer_updates) return update;
  LocalReducer local;
  update(ctx.reducer ? *ctx.reducer : local);
  return {};
}

std::function<void(Reducer&)> Vq::update_from(const at::Tensor& x, const at::Tensor& indices,
                                              const QuantizeContext& ctx, const VqUpdate& call) {
  torch::NoGradGuard no_grad;
  const int64_t b = x.size(0);
  const int64_t n = x.dim() == 3 ? x.size(1) : 0;
  const int64_t heads = options_.heads();
  const at::Tensor tokens = prepare(group_by_codebook(x)).detach();  // (C, M, cd)
  LOCKSTEP_CHECK_ARG(
      indices.numel() == b * n * heads && indices.size(0) == b, "vq: update_from takes the indices of x's tokens, (", b,
      ", ", n, heads > 1 ? ::lockstep::detail::concat(", ", heads, ")") : std::string(")"), ", got ", indices.sizes());
  const at::Tensor per_head = indices.to(torch::kInt64).reshape({b, n, heads});
  const at::Tensor grouped = options_.separate_codebook_per_head() ? per_head.permute({2, 0, 1}).reshape({heads, -1})
                                                                   : per_head.reshape({1, -1});
  LOCKSTEP_CHECK_ARG(grouped.numel() == 0 || grouped.max().item<int64_t>() < options_.codebook_size(),
                     "vq: update_from's indices must lie in [0, ", options_.codebook_size(), ") or be -1");
  LOCKSTEP_CHECK_ARG(grouped.numel() == 0 || grouped.min().item<int64_t>() >= -1,
                     "vq: update_from's indices must lie in [0, ", options_.codebook_size(), ") or be -1");
  // What counts: tokens the mask keeps whose index is not -1 (for every codebook of the token).
  at::Tensor counted = (grouped >= 0).all(0);  // (M)
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  if (mask.defined()) {
    const int64_t per_token = options_.separate_codebook_per_head() ? 1 : heads;
    counted = counted.logical_and(mask.reshape({b * n, 1}).expand({b * n, per_token}).reshape(-1));
  }
  const at::Tensor positions = counted.nonzero().squeeze(1);
  return state_update(tokens.index_select(1, positions), grouped.index_select(1, positions), ctx, false, call);
}

void Vq::kmeans_init_from(const at::Tensor& tokens, const QuantizeContext& ctx) {
  torch::NoGradGuard no_grad;
  LocalReducer local;
  Reducer& reducer = ctx.reducer ? *ctx.reducer : local;
  const int64_t k = options_.codebook_size();
  const int64_t codebooks = tokens.size(0);
  // Initial means are drawn from the gathered global batch with the shared generator: the same
  // on every holder, and the same as one process holding the whole batch would draw.
  const at::Tensor all = gather_tokens(tokens, reducer, LOCKSTEP_CALL_SITE("vq.kmeans.samples"));
  if (all.size(1) == 0) return;  // nobody held a token (every holder sees this): try again next time
  // Its own stream, seeded from a copy of the shared generator, which it leaves as it found it: the
  // draws after this call (dead codes) do not depend on whether k-means ran in it (torch.compile's
  // backward recomputes the call with the codebook already initialised).
  uint64_t stream = 0;
  {
    const at::Generator shared = or_default(ctx.generator).clone();
    stream = at::check_generator<at::CPUGeneratorImpl>(shared)->random64();
  }
  const at::Generator kmeans_generator =
      at::make_generator<at::CPUGeneratorImpl>(derive_seed(stream, +SeedPurpose::Quantizer, 1));
  std::vector<at::Tensor> initial;
  for (int64_t c = 0; c < codebooks; ++c) initial.push_back(sample_rows(all[c], k, kmeans_generator));
  const KmeansResult result =
      kmeans(tokens, torch::stack(initial), options_.kmeans_iters(), metric_, reducer, LOCKSTEP_CALL_SITE("vq.kmeans"));
  embed_.copy_(result.means);
  cluster_size_.copy_(result.counts);
  embed_avg_.copy_(result.means * result.counts.unsqueeze(2));
  initted_.fill_(1.0f);
}

void Vq::ema_update(const at::Tensor& tokens, const at::Tensor& indices, Reducer& reducer, const VqUpdate& call) {
  const int64_t k = options_.codebook_size();
  const int64_t codebooks = tokens.size(0);
  std::vector<at::Tensor> stats = code_counts_and_sums(tokens, indices, k);
  reducer.sum_(stats, LOCKSTEP_CALL_SITE("vq.ema"));  // exactly once per training call, whatever the data
  stats = to_float_stats(stats);
  at::Tensor counts = stats[0].view({codebooks, k});
  at::Tensor sums = stats[1].view({codebooks, k, -1});
  if (call.accumulate) {  // kept for the next update; the codebook stays
    pending_counts_ = pending_counts_.defined() ? pending_counts_.to(counts.device()) + counts : counts.clone();
    pending_sums_ = pending_sums_.defined() ? pending_sums_.to(sums.device()) + sums : sums.clone();
    return;
  }
  // The weights see the call's own global statistics, as the reference's callable does.
  at::Tensor weight = call.weight_fn ? call.weight_fn(sums, counts) : call.weight;
  if (pending_counts_.defined()) {
    counts = counts + pending_counts_.to(counts.device());
    sums = sums + pending_sums_.to(sums.device());
    pending_counts_ = at::Tensor();
    pending_sums_ = at::Tensor();
  }
  const double rate = 1.0 - options_.decay();
  if (weight.defined()) {
    LOCKSTEP_CHECK_ARG(weight.dim() == 0 || (weight.dim() == 1 && weight.size(0) == k) ||
                           (weight.dim() == 2 && weight.size(0) == codebooks && weight.size(1) == k),
                       "vq: ema_update_weight must be a number, (", k, ") or (", codebooks, ", ", k, "), got ",
                       weight.sizes());
    const at::Tensor per_code = (weight.to(cluster_size_.options()) * rate).expand({codebooks, k});
    cluster_size_.lerp_(counts, per_code);
    embed_avg_.lerp_(sums, per_code.unsqueeze(2));
  } else {
    cluster_size_.lerp_(counts, rate);
    embed_avg_.lerp_(sums, rate);
  }
  if (!call.ema_update.value_or(options_.ema_update())) return;  // the sizes feed dead codes; the codebook stays
  if (call.refresh_codebook && !options_.manual_ema_update()) refresh_codebook();
}

void Vq::update_ema() {
  torch::NoGradGuard no_grad;
  refresh_codebook();
}

void Vq::refresh_codebook() {
  const int64_t k = options_.codebook_size();
  // Laplace smoothing keeps every code's size positive without changing each codebook's total.
  const at::Tensor total = cluster_size_.sum(1, true);
  const double eps = options_.eps();
  const at::Tensor smoothed = (cluster_size_ + eps) / (total + static_cast<double>(k) * eps) * total;
  at::Tensor embed = embed_avg_ / smoothed.unsqueeze(2);
  if (options_.use_cosine_sim()) embed = l2norm(embed);
  embed_.copy_(embed);
}

void Vq::expire_dead_codes(const at::Tensor& tokens, Reducer& reducer, at::Generator generator) {
  const double threshold = options_.threshold_ema_dead_code();
  // Gathered on every training call (not only when codes died), so the collectives a step issues
  // depend on the configuration alone; samples come from the global batch with the shared generator.
  const at::Tensor all = gather_tokens(tokens, reducer, LOCKSTEP_CALL_SITE("vq.dead_code.samples"));
  if (all.size(1) == 0) return;
  for (int64_t c = 0; c < all.size(0); ++c) {
    const at::Tensor dead = (cluster_size_[c] < threshold).nonzero().squeeze(1);
    if (dead.numel() == 0) continue;
    const at::Tensor samples = sample_rows(all[c], dead.numel(), generator);
    embed_[c].index_copy_(0, dead, samples);
    cluster_size_[c].index_fill_(0, dead, threshold);
    embed_avg_[c].index_copy_(0, dead, samples * threshold);
  }
}

}  // namespace lockstep::quant
