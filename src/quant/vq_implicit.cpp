// Vq's searches among each token's own codes (an implicit neural codebook's, quant/implicit_codebook.h):
// the greedy layer of a residual stack, and the top-k of its beam search.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>

#include "lockstep/core/error.h"
#include "lockstep/core/random.h"
#include "lockstep/quant/search_log.h"
#include "lockstep/quant/vq.h"
#include "vq_internal.h"

namespace lockstep::quant {

using vq_detail::codes_with_token_gradient;
using vq_detail::l2norm;
using vq_detail::mask_topk;
using vq_detail::or_default;
using vq_detail::uniforms;

at::Tensor Vq::implicit_tokens(const at::Tensor& x, const at::Tensor& codes) {
  LOCKSTEP_CHECK_ARG(options_.heads() == 1 && !options_.affine_param(),
                     "vq: per-token codebooks take one head and no affine_param");
  const at::Tensor tokens = prepare(group_by_codebook(x)[0]);  // (M, cd); checks x's shape
  const int64_t cd = options_.codebook_dim();
  const int64_t k = options_.codebook_size();
  LOCKSTEP_CHECK_ARG(codes.dim() == 3 && codes.size(0) == tokens.size(0) && codes.size(1) == k && codes.size(2) == cd,
                     "vq: expected each token's codes (", tokens.size(0), ", ", k, ", ", cd, "), got ", codes.sizes());
  return tokens;
}

at::Tensor Vq::implicit_codes(const at::Tensor& tokens, const at::Tensor& book, std::optional<int64_t> top,
                              const QuantizeContext& ctx, int64_t first_row) const {
  torch::NoGradGuard no_grad;
  const int64_t m = tokens.size(0);
  const int64_t k = book.size(1);
  const bool sampled = samples(ctx);
  uint64_t key = 0;
  if (sampled) {  // drawn even when the choice is replayed: later draws see the generator as then
    at::Generator gen = or_default(ctx.generator);
    std::lock_guard<std::mutex> lock(gen.mutex());
    key = mix64(at::check_generator<at::CPUGeneratorImpl>(gen)->random64());
  }
  const std::vector<int64_t> shape = top ? std::vector<int64_t>{m, *top} : std::vector<int64_t>{m};
  return choose_codes(ctx, shape, [&] {
    at::Tensor logits = implicit_logits(tokens, book);
    if (sampled) {
      const at::Tensor u = uniforms(key, first_row, m, k, logits.options());
      logits = logits / temperature(ctx) - (-(u.log())).log();
    }
    return top ? std::get<1>(logits.topk(*top, 1)) : logits.argmax(1);
  });
}

at::Tensor Vq::implicit_logits(const at::Tensor& tokens, const at::Tensor& book) const {
  // The reference's distances: F.pairwise_distance (|x - c + 1e-6|), or the cosine similarity.
  return options_.use_cosine_sim() ? torch::einsum("md,mkd->mk", {tokens, book})
                                   : -(tokens.unsqueeze(1) - book + 1e-6).norm(2, -1);
}

at::Tensor Vq::implicit_code_logits(const at::Tensor& x, const at::Tensor& codes) {
  const at::Tensor tokens = implicit_tokens(x, codes);  // (M, cd)
  const at::Tensor logits = implicit_logits(tokens, options_.use_cosine_sim() ? l2norm(codes) : codes);
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
  // Through the projection in and out when codebook_dim != dim, as quantize's tokens.
  const at::Tensor tokens = implicit_tokens(x, codes);  // (M, cd), differentiable
  const int64_t cd = options_.codebook_dim();
  const int64_t b = x.size(0);
  const int64_t n = x.size(1);
  const int64_t m = b * n;
  const at::Tensor book = options_.use_cosine_sim() ? l2norm(codes) : codes;
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  const at::Tensor indices = implicit_codes(tokens, book, std::nullopt, ctx, ctx.first_item * n);  // (M)
  const at::Tensor q = chosen ? picked(chosen, indices)
                              : book.gather(1, indices.reshape({m, 1, 1}).expand({m, 1, cd})).squeeze(1);  // (M, cd)
  at::Tensor out;
  if (!is_training()) {
    out = codes_with_token_gradient(tokens, q);
  } else {
    out = estimated(tokens, q, or_default(ctx.generator), ctx.first_item * n);
  }
  QuantizerOutput result;
  at::Tensor counted;
  if (mask.defined()) counted = mask.reshape(-1).nonzero().squeeze(1);
  const auto only_counted = [&](const at::Tensor& t) { return counted.defined() ? t.index_select(0, counted) : t; };
  // As quantize's: a codebook not learned (or frozen) takes no gradient from the commitment loss.
  const bool learned = options_.learnable_codebook() && !ctx.freeze_codebook;
  const at::Tensor commit_codes = learned ? only_counted(q) : only_counted(q).detach();
  const at::Tensor commitment =
      only_counted(tokens).numel() > 0 ? torch::mse_loss(only_counted(tokens), commit_codes) : tokens.sum() * 0;
  result.losses["commitment"] = commitment * (options_.has_commitment_loss() ? options_.commitment_weight() : 0.0);
  if (is_training() && options_.codebook_diversity_loss_weight() > 0) {  // over each token's own codes' logits
    const at::Tensor logits = implicit_logits(tokens, book).reshape({b, n, options_.codebook_size()});
    result.losses["diversity"] = diversity_loss(logits, mask) * options_.codebook_diversity_loss_weight();
  }
  if (is_training() && (!ctx.defer_updates || at::GradMode::is_enabled())) {
    result.update =
        state_update(only_counted(tokens.detach()).unsqueeze(0), only_counted(indices).unsqueeze(0), ctx, false, {});
  }
  result.quantized = ungroup(out, b, n).to(x.scalar_type());
  result.indices = indices.reshape({b, n});
  apply_mask(mask, result.quantized, result.indices);
  return result;
}

VqTopk Vq::quantize_topk_implicit(const at::Tensor& x, const at::Tensor& codes, int64_t k, const QuantizeContext& ctx,
                                  const ChosenCodes& chosen) {
  const at::Tensor tokens = implicit_tokens(x, codes);  // (M, cd), differentiable
  LOCKSTEP_CHECK_ARG(k >= 1, "vq: top-k takes k >= 1, got ", k);
  k = std::min(k, options_.codebook_size());
  const int64_t cd = options_.codebook_dim();
  const int64_t b = x.size(0);
  const int64_t n = x.size(1);
  const int64_t m = b * n;
  const at::Tensor book = options_.use_cosine_sim() ? l2norm(codes) : codes;
  const at::Tensor mask = checked_mask(ctx, x, "vq");
  const at::Tensor indices = implicit_codes(tokens, book, k, ctx, ctx.first_item * n);  // (M, k), best first
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
  if (project_out_) out = project_out_->forward(out);
  result.quantized = out.reshape({b, n, k, options_.dim()}).to(x.scalar_type());
  result.indices = indices.reshape({b, n, k});
  mask_topk(mask, result);
  return result;
}

}  // namespace lockstep::quant
