// Vq's searches among each token's own codes (an implicit neural codebook's, quant/implicit_codebook.h):
// the greedy layer of a residual stack, and the top-k of its beam search.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>

#include "lockstep/core/error.h"
#include "lockstep/core/random.h"
#include "lockstep/quant/vq.h"
#include "vq_internal.h"

namespace lockstep::quant {

using vq_detail::codes_with_token_gradient;
using vq_detail::l2norm;
using vq_detail::mask_topk;
using vq_detail::or_default;
using vq_detail::uniforms;

std::pair<at::Tensor, at::Tensor> Vq::implicit_inputs(const at::Tensor& x, const at::Tensor& codes, bool one_codebook) {
  const at::Tensor tokens = prepare(group_by_codebook(x));  // (C, M, cd); checks x's shape
  const int64_t c = tokens.size(0);
  const int64_t m = tokens.size(1);
  const int64_t cd = options_.codebook_dim();
  const int64_t k = options_.codebook_size();
  LOCKSTEP_CHECK_ARG(!one_codebook || c == 1,
                     "vq: each token's own top-k codes or logits take one codebook (heads = 1)");
  const at::Tensor grouped = codes.dim() == 3 && c == 1 ? codes.unsqueeze(0) : codes;
  LOCKSTEP_CHECK_ARG(grouped.dim() == 4 && grouped.size(0) == c && grouped.size(1) == m && grouped.size(2) == k &&
                         grouped.size(3) == cd,
                     "vq: expected each token's codes (", c, ", ", m, ", ", k, ", ", cd, "), got ", codes.sizes());
  return {tokens, grouped};
}

NearestCode Vq::implicit_codes(const at::Tensor& tokens, const at::Tensor& book, std::optional<int64_t> top,
                               const QuantizeContext& ctx, int64_t first_row) const {
  torch::NoGradGuard no_grad;
  const int64_t m = tokens.size(0);
  const int64_t k = book.size(1);
  const bool sampled = samples(ctx);
  uint64_t key = 0;
  if (sampled) {
    at::Generator gen = or_default(ctx.generator);
    std::lock_guard<std::mutex> lock(gen.mutex());
    key = mix64(at::check_generator<at::CPUGeneratorImpl>(gen)->random64());
  }
  const at::Tensor logits = implicit_logits(tokens, book);
  at::Tensor ranked = logits;
  if (sampled) {
    const at::Tensor u = uniforms(key, first_row, m, k, logits.options());
    ranked = logits / temperature(ctx) - (-(u.log())).log();
  }
  // The first of the largest for the best code and the top alike, so the best is the top's first.
  const at::Tensor index = smallest_first(ranked.neg(), top.value_or(1));
  const at::Tensor score = logits.gather(1, index);
  return top ? NearestCode{index, score} : NearestCode{index.select(1, 0), score.select(1, 0)};
}

at::Tensor Vq::implicit_logits(const at::Tensor& tokens, const at::Tensor& book) const {
  // The reference's distances: F.pairwise_distance (|x - c + 1e-6|), or the cosine similarity.
  return options_.use_cosine_sim() ? torch::einsum("md,mkd->mk", {tokens, book})
                                   : -(tokens.unsqueeze(1) - book + 1e-6).norm(2, -1);
}

at::Tensor Vq::implicit_code_logits(const at::Tensor& x, const at::Tensor& codes) {
  const auto [tokens, given] = implicit_inputs(x, codes, true);  // (1, M, cd), (1, M, K, cd)
  const at::Tensor logits = implicit_logits(tokens[0], options_.use_cosine_sim() ? l2norm(given[0]) : given[0]);
  return logits.reshape({x.size(0), x.size(1), options_.codebook_size()});
}

at::Tensor Vq::picked(const ChosenCodes& chosen, const at::Tensor& indices) const {
  const at::Tensor q = chosen(indices);
  LOCKSTEP_CHECK_ARG(q.dim() == indices.dim() + 1 && q.sizes().slice(0, indices.dim()) == indices.sizes() &&
                         q.size(-1) == options_.codebook_dim(),
                     "vq: the chosen codes of indices ", indices.sizes(), " came as ", q.sizes());
  return options_.use_cosine_sim() ? l2norm(q) : q;
}

QuantizerOutput Vq::quantize_implicit(const at::Tensor& x, const at::Tensor& codes, const QuantizeContext& ctx,
                                      const ChosenCodes& chosen) {
  // Through the projection in and out when codebook_dim != dim, grouped by codebook as quantize's tokens.
  const auto [tokens, given] = implicit_inputs(x, codes, false);  // (C, M, cd), (C, M, K, cd)
  const int64_t cd = options_.codebook_dim();
  const int64_t b = x.size(0);
  const int64_t n = x.size(1);
  const int64_t codebooks = tokens.size(0);
  const int64_t m = tokens.size(1);
  const int64_t per_item = b > 0 ? m / b : 0;
  LOCKSTEP_CHECK_ARG(!chosen || codebooks == 1, "vq: codes made for the chosen indices take one codebook");
  const at::Tensor book = options_.use_cosine_sim() ? l2norm(given) : given;
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  std::vector<at::Tensor> per_codebook_indices, per_codebook_codes;
  for (int64_t c = 0; c < codebooks; ++c) {  // one search (and draw) per codebook, as quantize's
    const at::Tensor idx =
        implicit_codes(tokens[c], book[c], std::nullopt, ctx, ctx.first_item * per_item).indices;  // (M)
    per_codebook_codes.push_back(chosen ? picked(chosen, idx)
                                        : book[c].gather(1, idx.reshape({m, 1, 1}).expand({m, 1, cd})).squeeze(1));
    per_codebook_indices.push_back(idx);
  }
  const at::Tensor indices = torch::stack(per_codebook_indices);  // (C, M)
  const at::Tensor q = torch::stack(per_codebook_codes);          // (C, M, cd)
  at::Tensor out;
  if (!is_training()) {
    out = codes_with_token_gradient(tokens, q);
  } else {
    out = estimated(tokens.reshape({-1, cd}), q.reshape({-1, cd}), or_default(ctx.generator), ctx.first_item * per_item)
              .reshape(tokens.sizes());
  }
  QuantizerOutput result;
  // Positions (along M) of the tokens that count, as quantize's: a masked token's heads none.
  at::Tensor counted;
  if (mask.defined()) {
    const int64_t per_token = options_.separate_codebook_per_head() ? 1 : options_.heads();
    counted = mask.reshape({b * n, 1}).expand({b * n, per_token}).reshape(-1).nonzero().squeeze(1);
  }
  const auto only_counted = [&](const at::Tensor& t) { return counted.defined() ? t.index_select(1, counted) : t; };
  // As quantize's: a codebook not learned (or frozen) takes no gradient from the commitment loss.
  const bool learned = options_.learnable_codebook() && !ctx.freeze_codebook;
  const at::Tensor commit_codes = learned ? only_counted(q) : only_counted(q).detach();
  const at::Tensor commitment =
      only_counted(tokens).numel() > 0 ? torch::mse_loss(only_counted(tokens), commit_codes) : tokens.sum() * 0;
  result.losses["commitment"] = commitment * (options_.has_commitment_loss() ? options_.commitment_weight() : 0.0);
  if (is_training() && options_.codebook_diversity_loss_weight() > 0) {  // over each token's own codes' logits
    std::vector<at::Tensor> logits;
    for (int64_t c = 0; c < codebooks; ++c) logits.push_back(implicit_logits(tokens[c], book[c]));
    const int64_t k = options_.codebook_size();
    const int64_t heads = options_.heads();
    const at::Tensor all = torch::stack(logits);  // (C, M, K) -> (b, n, heads, K), as code_logits lays them out
    const at::Tensor per_head = options_.separate_codebook_per_head()
                                    ? all.reshape({heads, b, n, k}).permute({1, 2, 0, 3})
                                    : all.reshape({b, n, heads, k});
    result.losses["diversity"] = diversity_loss(heads == 1 ? per_head.reshape({b, n, k}) : per_head, mask) *
                                 options_.codebook_diversity_loss_weight();
  }
  if (ctx.may_change_state(is_training())) {
    // The affine statistics follow the call, as quantize's (a caller's codes were made from the moved codebook).
    result.update = state_update(only_counted(tokens.detach()), only_counted(indices), ctx, true, {});
  }
  result.quantized = ungroup(out, b, n).to(x.scalar_type());
  result.indices = ungroup_indices(indices, b, n);
  apply_mask(mask, result.quantized, result.indices);
  return result;
}

VqTopk Vq::quantize_topk_implicit(const at::Tensor& x, const at::Tensor& codes, int64_t k, const QuantizeContext& ctx,
                                  const ChosenCodes& chosen) {
  const auto [grouped_tokens, given] = implicit_inputs(x, codes, true);
  const at::Tensor tokens = grouped_tokens[0];  // (M, cd), differentiable
  const at::Tensor book = options_.use_cosine_sim() ? l2norm(given[0]) : given[0];
  LOCKSTEP_CHECK_ARG(k >= 1, "vq: top-k takes k >= 1, got ", k);
  k = std::min(k, options_.codebook_size());
  const int64_t cd = options_.codebook_dim();
  const int64_t b = x.size(0);
  const int64_t n = x.size(1);
  const int64_t m = b * n;
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  const NearestCode top = implicit_codes(tokens, book, k, ctx, ctx.first_item * n);  // (M, k), best first
  const at::Tensor& indices = top.indices;
  const at::Tensor q = chosen ? picked(chosen, indices) : book.gather(1, indices.unsqueeze(2).expand({m, k, cd}));
  const at::Tensor token = tokens.unsqueeze(1).expand({m, k, cd});
  at::Tensor out;
  if (!is_training()) {
    out = codes_with_token_gradient(token, q);
  } else {
    out = estimated(token.reshape({-1, cd}), q.reshape({-1, cd}), or_default(ctx.generator), ctx.first_item * n * k)
              .reshape({m, k, cd});
  }
  VqTopk result;
  // In evaluation the code losses reach the codes (the caller's function of the codebook), as the reference's.
  const bool learned = !is_training() || (options_.learnable_codebook() && !ctx.freeze_codebook);
  result.code_loss = (token - (learned ? q : q.detach())).pow(2).mean(-1).reshape({b, n, k});
  // The searched logits: minus the pairwise distance (squared here), or the similarity.
  const at::Tensor searched = options_.use_cosine_sim() ? top.score : top.score.square();
  result.distance = vq_detail::ranked_distance(searched, metric_, cd).reshape({b, n, k});
  if (project_out_) out = project_out_->forward(out);
  result.quantized = out.reshape({b, n, k, options_.dim()}).to(x.scalar_type());
  result.indices = indices.reshape({b, n, k});
  mask_topk(mask, result);
  return result;
}

}  // namespace lockstep::quant
