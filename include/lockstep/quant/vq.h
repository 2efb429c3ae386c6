// Vector quantizer with an EMA codebook (van den Oord et al. 2017; the EMA variant of Razavi et
// al. 2019), as defined in docs/quantizers.md section "VQ" after lucidrains/vector-quantize-pytorch.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/option_fields.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

enum class VqEstimator {
  StraightThrough,     // x + (q - x).detach()
  RotationTrick,       // Fifty et al. 2024: forward value q, gradient rotated from x onto q
  DirectionalReparam,  // DiVeQ (Vali et al.): x + sg(u) |q - x|, u the unit direction of q - x + noise
};

struct VqOptions {
  VqOptions(int64_t dim, int64_t codebook_size) : dim_(dim), codebook_size_(codebook_size) {}

  VqOptions& use_cosine_sim(bool on) {
    use_cosine_sim_ = on;
    return *this;
  }
  // Unset: the rotation trick when dim > 1, else straight-through (the reference's default).
  VqOptions& estimator(VqEstimator e) {
    estimator_ = e;
    return *this;
  }

  // Every option: vq_options.def, one line each (option_fields.h).
#define LOCKSTEP_OPTIONS VqOptions
#define LOCKSTEP_OPTIONS_FIELDS "lockstep/quant/vq_options.def"
#include "lockstep/quant/option_fields.inc"

  bool use_cosine_sim() const { return use_cosine_sim_; }
  VqEstimator estimator() const {
    return estimator_.value_or(dim_ > 1 ? VqEstimator::RotationTrick : VqEstimator::StraightThrough);
  }
  // Length of each code; unset means dim. Linear projections in and out are added when
  // heads * codebook_dim != dim.
  int64_t codebook_dim() const { return codebook_dim_.value_or(dim_); }
  // The commitment loss counts: its weight > 0 and not DiVeQ's estimator, as the reference's.
  bool has_commitment_loss() const { return commitment_weight_ > 0 && estimator() != VqEstimator::DirectionalReparam; }
  // Whether the codebook is a parameter: learned by gradient, or trained by the regulariser.
  bool codebook_is_parameter() const { return learnable_codebook_ || orthogonal_reg_weight_ > 0; }
  // Codebooks held: heads with separate codebooks, else 1.
  int64_t num_codebooks() const { return separate_codebook_per_head_ ? heads_ : 1; }

  // Throws InvalidArgument with the value: a field outside its limits, dim, codebook_size or
  // codebook_dim < 1, learnable_codebook with ema_update or with cosine similarity, affine_param with
  // cosine similarity, DiVeQ without dead-code replacement, sync_update_v above 0 without a learnable
  // codebook, orthogonal_reg_active_codes_only with separate codebooks per head.
  void validate() const;

 private:
  bool use_cosine_sim_ = false;
  std::optional<VqEstimator> estimator_;
};

// What one call may change about the EMA update (vector-quantize-pytorch's forward arguments).
struct VqUpdate {
  // Per-code weights of the update, (C, K) or (K,): code k's statistics move by (1 - decay) w_k toward the
  // call's (0 keeps them). Undefined: 1 for every code.
  at::Tensor weight;
  // The weights from the call's global statistics, weight_fn(embed_sum (C, K, cd), cluster_size (C, K)),
  // when set (it takes precedence over `weight`).
  std::function<at::Tensor(const at::Tensor& embed_sum, const at::Tensor& cluster_size)> weight_fn;
  // Adds the call's global statistics to those pending and leaves the codebook (and dead codes) as they
  // are; the next update that does not accumulate folds the pending statistics into its own.
  bool accumulate = false;
  // This call's ema_update: false tracks the statistics without moving the codebook. Unset: the option's.
  std::optional<bool> ema_update;
  // false: the statistics move but the codebook is not recomputed from them (the reference's
  // manual_ema_update: a codebook shared by residual layers is recomputed once, by refresh_update()).
  bool refresh_codebook = true;
};

// A search of each token's k best codes (the reference's forward(x, topk=k)); see Vq::quantize_topk.
struct VqTopk {
  at::Tensor quantized;  // (b, n, k, dim): each code projected out, with the estimator's gradient in training
  at::Tensor indices;    // (b, n, k) int64, best first; -1 at masked tokens
  at::Tensor code_loss;  // (b, n, k): mean((token - code)^2) over the code, unweighted; 0 at masked tokens
  // (b, n, k), no gradient: the distance the search ranked each code by, on code_loss's scale (the squared
  // distance over codebook_dim; cosine 2 - 2 x.e for x.e the similarity it ranked); what a beam search sums,
  // so that it ranks the distances the search did. 0 at masked tokens.
  at::Tensor distance;
  std::map<std::string, at::Tensor> losses;  // scalar terms of the call ("orthogonal")
  std::function<void(Reducer&)> update;      // deferred (QuantizeContext::defer_updates); empty when none
};

class Vq final : public Quantizer {
 public:
  // The initial codebooks are Kaiming-uniform drawn from `generator`, or from torch's default CPU
  // generator when it is undefined (zeros instead when kmeans_init: k-means sets them). Projections,
  // when needed, are initialised by torch's default generator.
  explicit Vq(VqOptions options, at::Generator generator = {});

  std::string kind() const override { return "vq"; }
  bool draws_per_item() const override {
    return (options_.stochastic_sample_codes() && options_.sample_codebook_temp() > 0) ||
           (options_.route_gradients_to_input() && options_.estimator() == VqEstimator::DirectionalReparam);
  }
  int64_t dim() const override { return options_.dim(); }
  int64_t codebook_size() const override { return options_.codebook_size(); }
  int64_t num_indices() const override { return options_.heads(); }
  MaskSupport mask_support() const override { return MaskSupport::StatisticsAndOutput; }

  // Training mode: one ctx.reducer->sum_ per call (two tensors for all codebooks, tag "vq.ema"), one
  // gather of the batch ("vq.dead_code.samples") when dead codes are replaced, and on the first
  // training call with kmeans_init a gather ("vq.kmeans.samples") and kmeans_iters sums. Randomness
  // (k-means seeds, dead-code samples, stochastic sampling) comes from ctx.generator, else torch's
  // default generator. Losses: "commitment", and "orthogonal" when its weight > 0.
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  // quantize() with this call's EMA update changed as `update` says.
  QuantizerOutput quantize_with(const at::Tensor& x, const QuantizeContext& ctx, const VqUpdate& update);
  // The k-means initialisation quantize() would run first on this call's counted tokens (kmeans_init,
  // not yet initialised, a training call that may change state), run now; a no-op otherwise. For a
  // caller whose codebook depends on the result: VectorQuantize's vq_bridge runs on it before the search.
  void initialise(const at::Tensor& x, const QuantizeContext& ctx);
  // Each token's k best codes (k at most K; heads = 1, as the reference): the nearest, or in training with
  // stochastic_sample_codes the k largest of the Gumbel-perturbed logits (the same draws as quantize's),
  // ranked on the distances quantize's search compares (nearest_codes), so the first is quantize's code. No
  // EMA update and no dead codes, as the reference's top-k search (k-means initialisation and the affine
  // statistics still follow a training call); pick codes and call update_from() for that.
  VqTopk quantize_topk(const at::Tensor& x, int64_t k, const QuantizeContext& ctx);
  // The EMA update and dead-code replacement of tokens x (b, n, dim) with codes chosen elsewhere, `indices`
  // (b, n) or (b, n, heads) (the reference's update_indices): a token with index -1, or masked out by
  // ctx.mask, counts in nothing. Returns the update, to run once with a reducer (its collectives); empty
  // when nothing is trained (ema_update and dead codes off, or ctx.freeze_codebook).
  std::function<void(Reducer&)> update_from(const at::Tensor& x, const at::Tensor& indices, const QuantizeContext& ctx,
                                            const VqUpdate& update = {});
  // quantize() with each token's own codes, `codes` (b * n, K, codebook_dim), or (C, M, K, codebook_dim) per
  // codebook as quantize groups heads (an implicit neural codebook's, quant/implicit_codebook.h; a caller's
  // function of the codebook; x through the projection in and the output out when projected): the nearest by
  // the reference's
  // pairwise_distance (or the cosine similarity), or sampled in training with stochastic_sample_codes;
  // the output, its estimator and the commitment loss differentiable in the codes (a learned codebook).
  // Statistics (dead codes) as quantize's, of the chosen indices.
  // `chosen`, when given, makes the codes the search chose, differentiable: indices (M) -> (M, cd) (or (M, k) ->
  // (M, k, cd) for the top-k below); `codes` then serve the search alone (made without a gradient, say).
  using ChosenCodes = std::function<at::Tensor(const at::Tensor&)>;
  QuantizerOutput quantize_implicit(const at::Tensor& x, const at::Tensor& codes, const QuantizeContext& ctx,
                                    const ChosenCodes& chosen = {});
  // quantize_topk() with each token's own codes, `codes` (b * n, K, codebook_dim), as quantize_implicit takes
  // them: each token's k best by the same distance (sampled the same way in training), the code losses
  // differentiable in the codes. No statistics: the caller updates from the codes it keeps (update_from).
  VqTopk quantize_topk_implicit(const at::Tensor& x, const at::Tensor& codes, int64_t k, const QuantizeContext& ctx,
                                const ChosenCodes& chosen = {});
  // The end of a training call whose updates did not refresh the codebook (VqUpdate::refresh_codebook
  // false, a codebook shared by residual layers): the codebook recomputed from the statistics (with
  // ema_update), then dead codes replaced from x (b, n, dim), every layer's input together (ctx.mask
  // (b, n) keeps padding out). Deferred or run at once as ctx says, as quantize's update.
  std::function<void(Reducer&)> refresh_update(const at::Tensor& x, const QuantizeContext& ctx);
  // The codebook recomputed from the EMA statistics (Laplace-smoothed sizes; l2-normalised when
  // cosine), as the reference's Codebook.update_ema: with manual_ema_update, what the training calls
  // leave to the caller. Every rank holds the same statistics, so nothing is communicated.
  void update_ema();
  at::Tensor encode(const at::Tensor& x) override;
  at::Tensor decode(const at::Tensor& indices) override;
  // x (b, n, dim) -> each code's logit for each token, (b, n, K) or (b, n, heads, K): minus the
  // Euclidean distance, or the cosine similarity (the reference's `distances`, which it takes the
  // cross entropy of given codes over). Differentiable in x, and in a learnable codebook; changes no state.
  // `bridged`: the codebook as a module of the caller's made it from embed (QuantizeContext::codebook).
  at::Tensor code_logits(const at::Tensor& x, const at::Tensor& bridged = {});
  // The codebooks the search takes: embed (detached unless learnable), moved to the batch's
  // statistics with affine_param once they are set.
  // `bridged` (QuantizeContext::codebook: embed through the Python module's vq_bridge, (C, K, cd)) takes
  // embed's place when defined.
  at::Tensor searched_codebook(const at::Tensor& bridged = {}) const;
  // code_logits() among each token's own codes `codes` (b * n, K, codebook_dim), as quantize_implicit searches
  // them (minus the reference's pairwise_distance, or the cosine similarity): (b, n, K), differentiable in x
  // and the codes.
  at::Tensor implicit_code_logits(const at::Tensor& x, const at::Tensor& codes);
  // For an optimizer of the caller's stepping the codebook on the reference's in-place loss (its
  // in_place_codebook_optimizer): while on, each training call that may change the codebooks reports loss
  // "in_place" (the mean squared distance of its counted tokens to their codes, this process's, without a
  // gradient), and its update adds the gradient of that loss over the global batch to in_place_gradient.
  void keep_in_place_gradient(bool on) { keep_in_place_gradient_ = on; }
  // The gradients added since the last take, summed, (C, K, cd), at the codebook the searches took before
  // any affine_param transform (embed, or QuantizeContext::codebook); undefined when none was. Clears them.
  at::Tensor take_in_place_gradient();

  const VqOptions& options() const { return options_; }
  // Codebook state (C = num_codebooks(), cd = codebook_dim, the layout of the reference): embed
  // (C, K, cd), a buffer or, when options().codebook_is_parameter(), a parameter; buffers cluster_size
  // (C, K), embed_avg (C, K, cd), initted () float (1 once the codebooks hold real codes); with
  // affine_param, batch_mean, batch_variance, codebook_mean, codebook_variance (C, 1, cd) and
  // affine_initted () float (1 once a training update has set them).
  const at::Tensor& embed() const { return embed_; }
  const at::Tensor& cluster_size() const { return cluster_size_; }
  const at::Tensor& embed_avg() const { return embed_avg_; }
  bool initted() const;

 private:
  // (b, n, dim) -> (C, M, cd): every vector one codebook sees, projected, differentiable.
  at::Tensor group_by_codebook(const at::Tensor& x);
  // (C, M, cd) -> (b, n, dim), projected back.
  at::Tensor ungroup(const at::Tensor& grouped, int64_t b, int64_t n);
  // Indices (C, M) -> (b, n) or (b, n, heads) and back.
  at::Tensor ungroup_indices(const at::Tensor& indices, int64_t b, int64_t n) const;
  // Tokens (C, M, cd) the codebooks see: l2-normalised when cosine.
  at::Tensor prepare(const at::Tensor& grouped) const;
  // The call's sampling temperature (QuantizeContext::sample_codebook_temp, else the option's), and
  // whether a call samples its codes: training, stochastic_sample_codes and a temperature > 0.
  double temperature(const QuantizeContext& ctx) const;
  bool samples(const QuantizeContext& ctx) const;
  // Nearest codes (C, M), or Gumbel-max samples at `temperature` when `generator` is defined. first_token:
  // the global index of tokens' first row (sampled codes are keyed by it).
  at::Tensor assign(const at::Tensor& tokens, const at::Tensor& codebook, const at::Generator& generator,
                    double temperature, int64_t first_token) const;
  // chosen(indices), checked, l2-normalised under cosine similarity as the searched codes are.
  at::Tensor picked(const ChosenCodes& chosen, const at::Tensor& indices) const;
  // Tokens x (b, n, dim) through the projection in, grouped by codebook as quantize's (C, M, codebook_dim) and
  // differentiable, and each token's own codes as (C, M, K, codebook_dim) (given so, or (M, K, codebook_dim) for one
  // codebook); InvalidArgument unless the two suit a search (`one_codebook`: C = 1).
  std::pair<at::Tensor, at::Tensor> implicit_inputs(const at::Tensor& x, const at::Tensor& codes, bool one_codebook);
  // Each of its own codes' logit (M, K) for tokens (M, cd) among `codes` (M, K, cd), the search's.
  at::Tensor implicit_logits(const at::Tensor& tokens, const at::Tensor& codes) const;
  // The codebook diversity loss (codebook_diversity_loss_weight, unweighted) of a call's code logits (b, n[,
  // heads], K): minus the entropy of the probabilities averaged over the counted tokens (mask (b, n)) and heads
  // at each position, averaged over the positions that count one.
  at::Tensor diversity_loss(const at::Tensor& logits, const at::Tensor& mask) const;
  // Each token's best code (M), or its `top` best (M, top), among its own codes `book` (M, K, cd) for tokens
  // (M, cd): the reference's pairwise_distance or the cosine similarity, Gumbel-max sampled in training with
  // stochastic_sample_codes, rows keyed from first_row; one order for both (the best is the first of `top`).
  // Scores: each chosen code's logit, unperturbed (minus the distance, or the similarity).
  NearestCode implicit_codes(const at::Tensor& tokens, const at::Tensor& book, std::optional<int64_t> top,
                             const QuantizeContext& ctx, int64_t first_row) const;
  // (C, M) -> (C, M, cd), from `codebook` (C, K, cd).
  static at::Tensor lookup(const at::Tensor& codebook, const at::Tensor& indices);
  // d(searched codebook)/d(codes) of affine_param, (C, 1, cd); undefined where the search takes the codes.
  at::Tensor affine_scale() const;
  // One call's in-place gradient (keep_in_place_gradient), added when run: counted tokens (C, M, cd), their
  // indices (C, M), the codebook searched (C, K, cd) and affine_scale() as the search found it.
  std::function<void(Reducer&)> in_place_update(const at::Tensor& tokens, const at::Tensor& indices,
                                                const at::Tensor& searched, const at::Tensor& scale);
  // affine_param: folds the counted tokens' global statistics and the codebook's into the EMAs.
  void update_affine(const at::Tensor& tokens, Reducer& reducer);
  // Tokens (C, M, cd) moved from the batch's statistics to the codebooks' (identity until set).
  at::Tensor in_codebook_frame(const at::Tensor& tokens) const;
  // The orthogonal regulariser (weighted) over the codes orthogonal_codes() picks.
  at::Tensor orthogonal_loss(const at::Tensor& counted_indices, const QuantizeContext& ctx) const;
  // The code ids (int64) the regulariser takes: the active ones among `counted_indices` (C, M), at most
  // orthogonal_reg_max_codes of them drawn from a copy of the call's generator; undefined for all.
  at::Tensor orthogonal_codes(const at::Tensor& counted_indices, const QuantizeContext& ctx) const;
  void kmeans_init_from(const at::Tensor& tokens, const QuantizeContext& ctx);
  void ema_update(const at::Tensor& tokens, const at::Tensor& indices, Reducer& reducer, const VqUpdate& update);
  // embed from embed_avg and the Laplace-smoothed cluster sizes (l2-normalised when cosine).
  void refresh_codebook();
  // The state update of counted tokens (C, M, cd) assigned `indices` (C, M) (affine statistics, EMA, dead
  // codes), deferred or run at once as ctx says; what quantize and update_from share.
  std::function<void(Reducer&)> state_update(const at::Tensor& tokens, const at::Tensor& indices,
                                             const QuantizeContext& ctx, bool affine, const VqUpdate& update);
  // The training output of tokens t (N, cd) quantized to q (N, cd): the estimator's value and gradient,
  // the codes alone without route_gradients_to_input, the gradient scaled with sync_update_v. DiVeQ's
  // noise is keyed by the tokens' global rows (first_token + row) and a draw of `generator`.
  at::Tensor estimated(const at::Tensor& t, const at::Tensor& q, const at::Generator& generator,
                       int64_t first_token) const;
  // Top-k codes (M, k) of tokens (M, cd) in `codebook` (K, cd) and their scores (as nearest_codes'),
  // sampled as assign() samples when `generator` is defined; the first is assign()'s code.
  NearestCode topk_codes(const at::Tensor& tokens, const at::Tensor& codebook, int64_t k,
                         const at::Generator& generator, double temperature, int64_t first_token) const;
  void expire_dead_codes(const at::Tensor& tokens, Reducer& reducer, at::Generator generator);

  VqOptions options_;
  Metric metric_;
  torch::nn::Linear project_in_{nullptr};
  torch::nn::Sequential project_in_normed_{nullptr};  // (project_in, LayerNorm) with layernorm_after_project_in
  torch::nn::Linear project_out_{nullptr};
  at::Tensor embed_;
  at::Tensor cluster_size_;
  at::Tensor embed_avg_;
  at::Tensor initted_;
  at::Tensor batch_mean_, batch_variance_, codebook_mean_, codebook_variance_, affine_initted_;  // affine_param
  // Global statistics accumulated by VqUpdate::accumulate, not yet folded in: counts (C, K), sums (C, K, cd).
  // Not state (as the reference keeps them in the buffers' .grad): undefined when none are pending.
  at::Tensor pending_counts_, pending_sums_;
  bool keep_in_place_gradient_ = false;
  at::Tensor in_place_gradient_;  // (C, K, cd) summed; undefined when none is kept
};

// DiVeQ's output (n, d) for tokens t (n, d) and codes q (n, d) (Vali et al., the reference's
// directional_reparam): t + sg(u) |q - t|, u the unit direction of q - t plus Gaussian noise of `variance`,
// each element's noise keyed by a draw of `generator` (torch's default when undefined) and its token's global
// row first_token + row. Its value is q up to the noise's turn; its gradient reaches t and q.
at::Tensor directional_reparam(const at::Tensor& t, const at::Tensor& q, double variance,
                               const at::Generator& generator, int64_t first_token);

// The rotation trick's output (n, d) for tokens x (n, d) and their codes q (n, d): value q,
// gradient to x rotated (see docs/quantizers.md). Exposed for tests. On the CPU one fused pass; on
// any other device detail::rotate_to_torch.
at::Tensor rotate_to(const at::Tensor& x, const at::Tensor& q);

}  // namespace lockstep::quant
