#include "lockstep/quant/residual.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "lockstep/core/error.h"
#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {

void ResidualOptions::validate() const {
  check_fields("residual", *this);
  LOCKSTEP_CHECK_ARG(num_quantizers_ >= 1, "residual: num_quantizers = ", num_quantizers_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(quantize_dropout_cutoff_index_ < num_quantizers_,
                     "residual: quantize_dropout_cutoff_index = ", quantize_dropout_cutoff_index_,
                     " must lie in [0, num_quantizers = ", num_quantizers_, ")");
  LOCKSTEP_CHECK_ARG(codebook_sizes_.empty() || static_cast<int64_t>(codebook_sizes_.size()) == num_quantizers_,
                     "residual: codebook_sizes names ", codebook_sizes_.size(),
                     " layers, num_quantizers = ", num_quantizers_);
  LOCKSTEP_CHECK_ARG(eval_beam_size_.value_or(0) >= 0, "residual: eval_beam_size = ", eval_beam_size_.value_or(0),
                     " must be >= 0");
  LOCKSTEP_CHECK_ARG(beam_score_weights_.empty() || static_cast<int64_t>(beam_score_weights_.size()) == num_quantizers_,
                     "residual: beam_score_weights has ", beam_score_weights_.size(),
                     " weights, num_quantizers = ", num_quantizers_);
}

namespace {
// The stack's projection in (dim -> layer_dim) and out, drawn in that order, as the reference's constructor.
std::pair<torch::nn::Linear, torch::nn::Linear> stack_projections(int64_t dim, int64_t layer_dim) {
  torch::nn::Linear in(dim, layer_dim);
  torch::nn::Linear out(layer_dim, dim);
  return {in, out};
}
}  // namespace

bool Residual::draws_per_item() const {
  return options_.diveq() ||
         std::any_of(layers_.begin(), layers_.end(), [](const auto& l) { return l->draws_per_item(); });
}

Residual::Residual(std::string kind, ResidualOptions options, int64_t dim,
                   std::vector<std::shared_ptr<Quantizer>> layers, std::vector<at::Tensor> scales,
                   at::Tensor input_clamp, std::pair<torch::nn::Linear, torch::nn::Linear> projections)
    : Quantizer("Residual"),
      kind_(std::move(kind)),
      options_(std::move(options)),
      dim_(dim),
      layers_(std::move(layers)),
      scales_(std::move(scales)),
      input_clamp_(std::move(input_clamp)) {
  options_.validate();
  LOCKSTEP_CHECK_ARG(static_cast<int64_t>(layers_.size()) == options_.num_quantizers(), "residual: ", layers_.size(),
                     " layers given for num_quantizers = ", options_.num_quantizers());
  LOCKSTEP_CHECK_ARG(scales_.empty() || scales_.size() == layers_.size(), "residual: ", scales_.size(),
                     " scales given for ", layers_.size(), " layers");
  const int64_t layer_dim = layers_.front()->dim();
  for (size_t l = 0; l < layers_.size(); ++l) {
    LOCKSTEP_CHECK_ARG(layers_[l]->dim() == layer_dim, "residual: layer ", l, " takes dim ", layers_[l]->dim(),
                       ", layer 0 takes ", layer_dim);
    register_module("layer" + std::to_string(l), layers_[l]);
    num_indices_ += layers_[l]->num_indices();
    if (!scales_.empty()) scales_[l] = register_buffer("scale" + std::to_string(l), scales_[l].to(torch::kFloat32));
  }
  if (dim_ != layer_dim && projections.first.is_empty()) projections = stack_projections(dim_, layer_dim);
  if (dim_ != layer_dim) {
    project_in_ = register_module("project_in", projections.first);
    project_out_ = register_module("project_out", projections.second);
  }
  if (options_.implicit_neural_codebook()) {
    const auto* first = dynamic_cast<const Vq*>(layers_.front().get());
    LOCKSTEP_CHECK_ARG(first && scales_.empty(), kind_, ": implicit neural codebooks are residual-vq's");
    auto holder = register_module("mlps", std::make_shared<torch::nn::Module>());
    for (size_t l = 1; l < layers_.size(); ++l) {
      mlps_.push_back(holder->register_module(std::to_string(l - 1),
                                              ImplicitCodebook(ImplicitCodebookOptions(layer_dim)
                                                                   .hidden(options_.mlp_hidden())
                                                                   .depth(options_.mlp_depth())
                                                                   .l2norm_output(first->options().use_cosine_sim()))));
    }
  }
}

int64_t Residual::layers_to_run(const QuantizeContext& ctx) const {
  const int64_t q = options_.num_quantizers();
  if (!is_training() || !options_.quantize_dropout()) return q;
  if (ctx.dropout_layers > 0) return std::min(ctx.dropout_layers, q);  // the caller's choice, no draw
  LOCKSTEP_CHECK_ARG(ctx.dropout_layers == 0, kind_, ": dropout_layers = ", ctx.dropout_layers,
                     " must be >= 1 (0: drawn)");
  const int64_t low = options_.quantize_dropout_cutoff_index();
  const at::Generator generator = ctx.generator.defined() ? ctx.generator : at::detail::getDefaultCPUGenerator();
  const int64_t cutoff = torch::randint(low, q, {1}, generator, torch::kInt64).item<int64_t>();
  const int64_t multiple = options_.quantize_dropout_multiple_of();
  const int64_t kept = (cutoff + 1 + multiple - 1) / multiple * multiple;  // round c + 1 up to the multiple
  return std::min(kept, q);
}

at::Tensor Residual::to_layer_space(const at::Tensor& x) {
  const at::Tensor z = project_in_ ? project_in_->forward(x) : x;
  if (!input_clamp_.defined()) return z;
  const at::Tensor c = input_clamp_.to(z.device());
  return (z / c).tanh() * c;
}

QuantizerOutput Residual::quantize(const at::Tensor& x, const QuantizeContext& ctx) {
  const int64_t beam = is_training() ? options_.beam_size() : options_.eval_beam_size();
  return beam > 1 ? quantize_beam(x, ctx, beam) : quantize_greedy(x, ctx);
}

std::function<void(Reducer&)> Residual::shared_refresh(const std::vector<at::Tensor>& inputs,
                                                       const QuantizeContext& ctx) {
  if (!options_.shared_codebook() || inputs.empty()) return {};
  QuantizeContext all = ctx;
  const int64_t layers = static_cast<int64_t>(inputs.size());
  if (ctx.mask.defined()) all.mask = ctx.mask.repeat({1, layers});  // each layer's copy of the tokens
  return dynamic_cast<Vq&>(*layers_.front()).refresh_update(torch::cat(inputs, 1), all);
}

void Residual::initialise_layer(int64_t l, const at::Tensor& input, QuantizeContext& layer_ctx) {
  // k-means from the layer's input first (a no-op but in a training call of an uninitialised kmeans_init
  // layer), so that what makes the layer's codes from its codebook reads the initialised one.
  if (auto* vq = dynamic_cast<Vq*>(layers_[static_cast<size_t>(l)].get())) vq->initialise(input, layer_ctx);
  if (layer_ctx.layer_codebook) layer_ctx.codebook = layer_ctx.layer_codebook(l);
}

at::Tensor Residual::passed_on(const at::Tensor& q) const {
  const double frac = options_.quant_grad_frac();
  return frac > 0 ? frac * q + (1 - frac) * q.detach() : q.detach();
}

namespace {
// Layer l's codes of a caller's codebooks (L, ..., K_max, d), padded to the largest layer's: its first k.
at::Tensor layer_codes(const at::Tensor& given, int64_t l, int64_t k) {
  const at::Tensor codes = given[l];
  return codes.size(-2) > k ? codes.narrow(-2, 0, k) : codes;
}

// Layer codes of an implicit codebook for conditions (M, ld): every token's K codes for the search, made
// without a gradient, and a maker of the chosen ones with it, so the MLP's backward runs on the codes the
// search chose rather than on all K (the same values: the MLP maps each (condition, code) pair alone).
// `given`: the layer's codebook as the caller made it (1, K, ld) (a vq_bridge's), else the layer's own.
std::pair<at::Tensor, Vq::ChosenCodes> implicit_codes(ImplicitCodebook mlp, Vq& vq, const at::Tensor& condition,
                                                      const at::Tensor& given) {
  const at::Tensor base = given.defined() ? given[0] : vq.embed()[0];
  at::Tensor all;
  {
    torch::NoGradGuard no_grad;
    all = mlp->forward(base, condition);  // (M, K, ld)
  }
  Vq::ChosenCodes chosen = [mlp, base, condition](const at::Tensor& indices) mutable {
    const at::Tensor per_token = indices.dim() == 1 ? indices.unsqueeze(1) : indices;  // (M, k)
    const at::Tensor codes =
        base.index_select(0, per_token.reshape(-1)).reshape({per_token.size(0), per_token.size(1), base.size(1)});
    const at::Tensor q = mlp->forward_pairs(codes, condition);
    return indices.dim() == 1 ? q.squeeze(1) : q;
  };
  return {all, std::move(chosen)};
}
}  // namespace

QuantizerOutput Residual::quantize_greedy(const at::Tensor& x, const QuantizeContext& ctx) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == dim_, kind_, ": expected tokens (b, n, ", dim_, "), got ", x.sizes());
  // The layers keep masked tokens out of their statistics (or refuse a mask).
  const at::Tensor mask = checked_mask(ctx, x, kind_);
  const int64_t run = layers_to_run(ctx);
  const at::Tensor z = to_layer_space(x);
  at::Tensor residual = z;
  at::Tensor total = torch::zeros_like(z);
  std::vector<at::Tensor> indices;
  QuantizerOutput result;
  std::vector<std::function<void(Reducer&)>> updates;  // deferred: each layer's, in layer order
  std::vector<at::Tensor> inputs;                      // each layer's, for a shared codebook's refresh
  for (int64_t l = 0; l < options_.num_quantizers(); ++l) {
    Quantizer& layer = *layers_[l];
    if (l >= run) {
      indices.push_back(torch::full({x.size(0), x.size(1), layer.num_indices()}, -1, x.options().dtype(torch::kInt64)));
      continue;
    }
    const bool scaled = !scales_.empty();
    QuantizerOutput out;
    // A caller's codes for each layer (ResidualSimVQ's map of its frozen codes, ResidualVQ's vq_bridge).
    QuantizeContext layer_ctx = ctx;
    if (ctx.codebook.defined()) {
      LOCKSTEP_CHECK_ARG(ctx.codebook.dim() >= 1 && ctx.codebook.size(0) == options_.num_quantizers(), kind_,
                         ": expected one codebook per layer (", options_.num_quantizers(), "), got ",
                         ctx.codebook.sizes());
      layer_ctx.codebook = layer_codes(ctx.codebook, l, layer.codebook_size());
    }
    initialise_layer(l, residual, layer_ctx);
    if (!mlps_.empty() && l > 0) {  // this layer's codes from its base codebook and the codes before it
      auto& vq = dynamic_cast<Vq&>(layer);
      const int64_t ld = residual.size(2);
      const auto [codes, chosen] =
          implicit_codes(mlps_[static_cast<size_t>(l - 1)], vq, total.reshape({-1, ld}), layer_ctx.codebook);
      out = vq.quantize_implicit(residual, codes, ctx, chosen);
    } else if (options_.shared_codebook()) {  // statistics now, the shared codebook recomputed after the last layer
      VqUpdate track;
      track.refresh_codebook = false;
      inputs.push_back(residual.detach());
      out = dynamic_cast<Vq&>(layer).quantize_with(residual, layer_ctx, track);
    } else {
      out = layer.quantize(scaled ? residual / scales_[l] : residual, layer_ctx);
    }
    const at::Tensor q = scaled ? out.quantized * scales_[l] : out.quantized;
    // The reference's frac_gradient: a share of q's gradient reaches the layers before through the residual.
    residual = residual - passed_on(q);
    total = total + q;
    indices.push_back(out.indices.reshape({x.size(0), x.size(1), layer.num_indices()}));
    for (auto& [name, loss] : out.losses) result.losses["layer" + std::to_string(l) + "." + name] = loss;
    if (out.update) updates.push_back(std::move(out.update));
  }
  if (ctx.may_change_state(is_training())) {
    if (auto refresh = shared_refresh(inputs, ctx)) updates.push_back(std::move(refresh));
  }
  if (options_.diveq()) {  // the stack's output: DiVeQ from the (projected) input to the codes' sum
    const int64_t ld = total.size(2);
    total = directional_reparam(z.reshape({-1, ld}), total.reshape({-1, ld}), 5e-3, ctx.generator,
                                ctx.first_item * x.size(1))
                .reshape(total.sizes());
  }
  if (!updates.empty()) {
    result.update = [updates = std::move(updates)](Reducer& reducer) {
      for (const auto& update : updates) update(reducer);
    };
  }
  result.quantized = project_out_ ? project_out_->forward(total) : total;
  result.indices = torch::cat(indices, 2);
  // After the projection, whose bias would otherwise reach the padding.
  if (mask_support() == MaskSupport::StatisticsAndOutput) apply_mask(mask, result.quantized, result.indices);
  return result;
}

namespace {
// Rows `keep` (M, J') of every candidate's history t (M, J, ...): t[m, keep[m, j]].
at::Tensor select_beams(const at::Tensor& t, const at::Tensor& keep) {
  std::vector<int64_t> shape = keep.sizes().vec();
  for (int64_t d = 2; d < t.dim(); ++d) shape.push_back(1);
  std::vector<int64_t> expanded = keep.sizes().vec();
  for (int64_t d = 2; d < t.dim(); ++d) expanded.push_back(t.size(d));
  return t.gather(1, keep.reshape(shape).expand(expanded));
}

// t (M, J, ...) -> (M, J * k, ...): each candidate's history repeated for its k continuations.
at::Tensor repeat_beams(const at::Tensor& t, int64_t k) {
  std::vector<int64_t> expanded = t.sizes().vec();
  expanded.insert(expanded.begin() + 2, k);
  std::vector<int64_t> merged = t.sizes().vec();
  merged[1] *= k;
  return t.unsqueeze(2).expand(expanded).reshape(merged);
}
}  // namespace

QuantizerOutput Residual::quantize_beam(const at::Tensor& x, const QuantizeContext& ctx, int64_t beam) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == dim_, kind_, ": expected tokens (b, n, ", dim_, "), got ", x.sizes());
  LOCKSTEP_CHECK_ARG(beam >= 1, kind_, ": a beam of ", beam, " paths; it must be >= 1");
  if (beam == 1) return quantize_greedy(x, ctx);
  LOCKSTEP_CHECK_ARG(!ctx.codebook.defined() || ctx.codebook.size(0) == options_.num_quantizers(), kind_,
                     ": a beam search takes one caller's codebook per layer (a vq_bridge's), got ",
                     ctx.codebook.sizes());
  std::vector<Vq*> vqs;
  for (const auto& layer : layers_) {
    vqs.push_back(dynamic_cast<Vq*>(layer.get()));
    LOCKSTEP_CHECK_ARG(vqs.back() && scales_.empty(), kind_, ": beam search is residual-vq's (its layers VQ)");
  }
  const at::Tensor mask = checked_mask(ctx, x, kind_);
  const int64_t b = x.size(0);
  const int64_t n = x.size(1);
  const int64_t m = b * n;
  const int64_t run = layers_to_run(ctx);
  const at::Tensor z = to_layer_space(x);
  const int64_t ld = z.size(2);
  // Every candidate path of every token: (M, J, ...) with J paths, one at first.
  at::Tensor residual = z.reshape({m, 1, ld});
  at::Tensor total = torch::zeros_like(residual);
  at::Tensor scores = torch::zeros({m, 1}, z.options().dtype(torch::kFloat32));
  at::Tensor chosen = torch::empty({m, 1, 0}, z.options().dtype(torch::kInt64));
  at::Tensor code_losses = torch::empty({m, 1, 0}, scores.options());
  at::Tensor inputs = torch::empty({m, 1, 0, ld}, z.options());  // each layer's input, for the updates
  std::map<std::string, at::Tensor> scalar_losses;
  const std::vector<double>& weights = options_.beam_score_weights();
  for (int64_t l = 0; l < run; ++l) {
    Vq& vq = *vqs[static_cast<size_t>(l)];
    const int64_t paths = residual.size(1);
    QuantizeContext layer_ctx = ctx;
    if (mask.defined()) layer_ctx.mask = mask.reshape({m, 1}).expand({m, paths});
    VqTopk top;  // (M, J, k, ...)
    if (ctx.codebook.defined()) layer_ctx.codebook = layer_codes(ctx.codebook, l, vq.codebook_size());  // a bridge's
    initialise_layer(l, residual, layer_ctx);
    if (!mlps_.empty() && l > 0) {  // each path's codes from the base codebook and the path's codes before
      const auto [codes, chosen] =
          implicit_codes(mlps_[static_cast<size_t>(l - 1)], vq, total.reshape({-1, ld}), layer_ctx.codebook);
      top = vq.quantize_topk_implicit(residual, codes, beam, layer_ctx, chosen);
    } else {
      top = vq.quantize_topk(residual, beam, layer_ctx);
    }
    const int64_t k = top.indices.size(2);
    // The reference's loss of a code: weighted when the weight is > 0; in training with weight 0, none.
    const double weight = vq.options().commitment_weight();
    const at::Tensor loss = weight > 0 ? top.code_loss * weight : (is_training() ? top.code_loss * 0 : top.code_loss);
    // Paths are scored by the distances the layer's search ranked (the losses' values, on their scale),
    // so that a beam ranks codes as the nearest search does.
    const at::Tensor ranked =
        weight > 0 ? top.distance * weight : (is_training() ? torch::zeros_like(top.distance) : top.distance);
    scores = (scores.unsqueeze(2) - ranked * (weights.empty() ? 1.0 : weights[static_cast<size_t>(l)]))
                 .reshape({m, paths * k});
    inputs = torch::cat({repeat_beams(inputs, k), repeat_beams(residual.unsqueeze(2), k)}, 2);
    residual = (residual.unsqueeze(2) - passed_on(top.quantized)).reshape({m, paths * k, ld});
    total = (total.unsqueeze(2) + top.quantized).reshape({m, paths * k, ld});
    chosen = torch::cat({repeat_beams(chosen, k), top.indices.reshape({m, paths * k, 1})}, 2);
    code_losses = torch::cat({repeat_beams(code_losses, k), loss.reshape({m, paths * k, 1})}, 2);
    for (const auto& [name, value] : top.losses) scalar_losses["layer" + std::to_string(l) + "." + name] = value;
    const int64_t keep = l == run - 1 ? 1 : beam;
    if (paths * k > keep) {
      // (M, keep), best first; of equal scores the earlier path (the better parent, then the nearer code)
      const at::Tensor best = smallest_first(scores.neg(), keep);
      scores = scores.gather(1, best);
      residual = select_beams(residual, best);
      total = select_beams(total, best);
      chosen = select_beams(chosen, best);
      code_losses = select_beams(code_losses, best);
      inputs = select_beams(inputs, best);
    }
  }
  QuantizerOutput result = {};
  // The best path: its codes, indices (-1 for dropped layers) and each layer's mean loss over counted tokens.
  const at::Tensor counted =
      mask.defined() ? mask.reshape({m}).to(scores.scalar_type()) : torch::ones({m}, scores.options());
  const at::Tensor count = counted.sum().clamp_min(1e-4);  // the reference's clamp
  for (int64_t l = 0; l < run; ++l) {
    at::Tensor value = (code_losses.select(1, 0).select(1, l) * counted).sum() / count;
    const auto found = scalar_losses.find("layer" + std::to_string(l) + ".orthogonal");
    if (found != scalar_losses.end()) value = value + found->second;
    result.losses["layer" + std::to_string(l) + ".commitment"] = value;
  }
  at::Tensor indices = chosen.select(1, 0);  // (M, run)
  if (run < options_.num_quantizers()) {
    indices = torch::cat({indices, torch::full({m, options_.num_quantizers() - run}, -1, indices.options())}, 1);
  }
  const at::Tensor out = total.select(1, 0).reshape({b, n, ld});
  result.quantized = project_out_ ? project_out_->forward(out) : out;
  result.indices = indices.reshape({b, n, options_.num_quantizers()});
  // Each layer's EMA update from the chosen path's residual and code, in layer order.
  if (ctx.may_change_state(is_training())) {
    std::vector<std::function<void(Reducer&)>> updates;
    VqUpdate track;  // a shared codebook: statistics now, recomputed once after the last layer
    track.refresh_codebook = !options_.shared_codebook();
    std::vector<at::Tensor> layer_inputs;
    for (int64_t l = 0; l < run; ++l) {
      layer_inputs.push_back(inputs.select(1, 0).select(1, l).reshape({b, n, ld}));
      auto update = vqs[static_cast<size_t>(l)]->update_from(
          layer_inputs.back(), chosen.select(1, 0).select(1, l).reshape({b, n}), ctx, track);
      if (update) updates.push_back(std::move(update));
    }
    if (auto refresh = shared_refresh(layer_inputs, ctx)) updates.push_back(std::move(refresh));
    if (!updates.empty()) {
      result.update = [updates = std::move(updates)](Reducer& reducer) {
        for (const auto& update : updates) update(reducer);
      };
    }
  }
  apply_mask(mask, result.quantized, result.indices);
  return result;
}

at::Tensor Residual::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == dim_, kind_, ": expected tokens (b, n, ", dim_, "), got ", x.sizes());
  at::Tensor residual = to_layer_space(x);
  std::vector<at::Tensor> indices;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Quantizer& layer = *layers_[l];
    const bool scaled = !scales_.empty();
    const at::Tensor idx = layer.encode(scaled ? residual / scales_[l] : residual);
    const at::Tensor q = layer.decode(idx);
    residual = residual - (scaled ? q * scales_[l] : q);
    indices.push_back(idx.reshape({x.size(0), x.size(1), layer.num_indices()}));
  }
  return torch::cat(indices, 2);
}

at::Tensor Residual::decode_layers(const at::Tensor& indices) {
  LOCKSTEP_CHECK_ARG(indices.dim() == 3 && indices.size(2) == num_indices_, kind_, ": expected indices (b, n, ",
                     num_indices_, "), got ", indices.sizes());
  const int64_t b = indices.size(0);
  const int64_t n = indices.size(1);
  const int64_t ld = layers_.front()->dim();
  at::Tensor total = torch::zeros({b, n, ld}, indices.options().dtype(torch::kFloat32));
  std::vector<at::Tensor> codes;
  int64_t offset = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Quantizer& layer = *layers_[l];
    const int64_t m = layer.num_indices();
    const at::Tensor slice = indices.narrow(2, offset, m);
    offset += m;
    const at::Tensor dropped = (slice < 0).any(2, true);  // (b, n, 1)
    LOCKSTEP_CHECK_ARG(torch::equal(dropped.expand_as(slice), slice < 0), kind_, ": layer ", l,
                       " has some but not all of a token's indices at -1");
    const at::Tensor kept = slice.clamp_min(0);
    at::Tensor q;
    if (!mlps_.empty() && l > 0) {  // the codes of this token's implicit codebook, from the codes before it
      auto& vq = dynamic_cast<Vq&>(layer);
      LOCKSTEP_CHECK_ARG(kept.numel() == 0 || kept.max().item<int64_t>() < vq.codebook_size(), kind_,
                         ": indices must lie in [0, ", vq.codebook_size(), ")");
      // Each token's code alone through the MLP (b n, 1, ld), not its whole codebook.
      const at::Tensor base = vq.embed()[0].index_select(0, kept.reshape(-1)).reshape({b * n, 1, ld});
      q = mlps_[l - 1]->forward_pairs(base, total.reshape({-1, ld}));
      if (vq.options().use_cosine_sim()) {
        q = torch::nn::functional::normalize(q, torch::nn::functional::NormalizeFuncOptions().dim(-1).eps(1e-6));
      }
      q = q.reshape({b, n, ld});
    } else {
      q = layer.decode(m == 1 ? kept.squeeze(2) : kept);
    }
    if (!scales_.empty()) q = q * scales_[l];
    q = q.masked_fill(dropped, 0.0);
    total = total + q;
    codes.push_back(q);
  }
  return torch::stack(codes);
}

at::Tensor Residual::decode(const at::Tensor& indices) {
  const at::Tensor total = decode_layers(indices).sum(0);
  return project_out_ ? project_out_->forward(total) : total;
}

std::shared_ptr<Residual> make_residual_vq(const ResidualOptions& given, const VqOptions& given_layer,
                                           at::Generator generator) {
  // As the reference: one projection for the stack to heads * codebook_dim, which the layers take whole.
  given.validate();
  LOCKSTEP_CHECK_ARG(given.soft_clamp().empty(), "residual-vq: soft_clamp is residual-fsq's and residual-lfq's");
  ResidualOptions options = given;
  VqOptions layer = given_layer;
  if (options.implicit_neural_codebook()) layer.ema_update(false).learnable_codebook(true);  // as the reference
  if (options.diveq()) {  // the reference's settings for DiVeQ's layers
    layer.ema_update(false).learnable_codebook(true).route_gradients_to_input(false).commitment_weight(0);
    options.quant_grad_frac(1.0);
  }
  const int64_t layer_dim = layer.heads() * layer.codebook_dim();
  // The reference draws the projections, then each layer's codebook (and the MLPs after them, in Residual).
  auto projections = layer.dim() != layer_dim ? stack_projections(layer.dim(), layer_dim)
                                              : std::pair<torch::nn::Linear, torch::nn::Linear>{nullptr, nullptr};
  if (options.shared_codebook()) {
    const auto& sizes = options.codebook_sizes();
    LOCKSTEP_CHECK_ARG(std::all_of(sizes.begin(), sizes.end(), [&](int64_t k) { return k == sizes.front(); }),
                       "residual-vq: a shared codebook needs one codebook size for every layer");
    VqOptions shared = VqOptions(layer).dim(layer_dim).codebook_dim(layer.codebook_dim());
    if (!sizes.empty()) shared.codebook_size(sizes.front());
    const auto vq = std::make_shared<Vq>(shared, generator);
    // The reference builds every layer's codebook, then gives the first to all: the others' draws are made too,
    // so that what a project builds after the quantizer starts from the same generator state.
    for (int64_t l = 1; l < options.num_quantizers(); ++l) std::make_shared<Vq>(shared, generator);
    return std::make_shared<Residual>("residual-vq", options, layer.dim(),
                                      std::vector<std::shared_ptr<Quantizer>>(options.num_quantizers(), vq),
                                      std::vector<at::Tensor>{}, at::Tensor{}, std::move(projections));
  }
  const std::vector<int64_t>& sizes = options.codebook_sizes();
  std::vector<std::shared_ptr<Quantizer>> layers;
  for (int64_t l = 0; l < options.num_quantizers(); ++l) {
    VqOptions each = VqOptions(layer).dim(layer_dim).codebook_dim(layer.codebook_dim());
    if (!sizes.empty()) each.codebook_size(sizes[static_cast<size_t>(l)]);
    layers.push_back(std::make_shared<Vq>(each, generator));
  }
  return std::make_shared<Residual>("residual-vq", options, layer.dim(), std::move(layers), std::vector<at::Tensor>{},
                                    at::Tensor{}, std::move(projections));
}

std::shared_ptr<Residual> make_residual_fsq(const ResidualOptions& options, const FsqOptions& layer) {
  LOCKSTEP_CHECK_ARG(!layer.orthogonal_rotation(), "residual-fsq: orthogonal_rotation is fsq's alone");
  LOCKSTEP_CHECK_ARG(options.codebook_sizes().empty(),
                     "residual-fsq: codebook_sizes is residual-vq's (its layers have no "
                     "codebook of their own size)");
  LOCKSTEP_CHECK_ARG(!options.shared_codebook() && !options.diveq() && !options.implicit_neural_codebook() &&
                         options.beam_size() <= 1 && options.eval_beam_size() <= 1,
                     "residual-fsq: shared_codebook, diveq, implicit codebooks and beam search are residual-vq's");
  const auto& levels = layer.levels();
  const int64_t layer_dim = static_cast<int64_t>(levels.size()) * layer.num_codebooks();
  const at::Tensor level_tensor =
      torch::tensor(levels, torch::kInt64).to(torch::kFloat64).repeat({layer.num_codebooks()});
  std::vector<std::shared_ptr<Quantizer>> layers;
  std::vector<at::Tensor> scales;
  for (int64_t l = 0; l < options.num_quantizers(); ++l) {
    layers.push_back(std::make_shared<Fsq>(FsqOptions(layer).dim(layer_dim).preserve_symmetry(true)));
    scales.push_back(level_tensor.pow(-static_cast<double>(l)).to(torch::kFloat32));
  }
  // Layers that clamp rather than squash get an input already in range: c = 1 + 1/(L-1); else the given one.
  const auto& soft = options.soft_clamp();
  LOCKSTEP_CHECK_ARG(soft.empty() || !layer.bound_hard_clamp(),
                     "residual-fsq: soft_clamp is for layers without bound_hard_clamp, which sets its own");
  LOCKSTEP_CHECK_ARG(soft.size() <= 1 || static_cast<int64_t>(soft.size()) == layer_dim,
                     "residual-fsq: soft_clamp "
                     "has ",
                     soft.size(), " values; give one, or one per dimension (", layer_dim, ")");
  at::Tensor input_clamp;
  if (layer.bound_hard_clamp()) input_clamp = 1 + 1 / (level_tensor.to(torch::kFloat32) - 1);  // in float32, as torch
  if (!soft.empty()) input_clamp = torch::tensor(soft, torch::kFloat64).to(torch::kFloat32);
  return std::make_shared<Residual>("residual-fsq", options, layer.dim().value_or(layer_dim), std::move(layers),
                                    std::move(scales), std::move(input_clamp));
}

std::shared_ptr<Residual> make_residual_simvq(const ResidualOptions& options, const SimVqOptions& layer) {
  LOCKSTEP_CHECK_ARG(options.soft_clamp().empty(), "residual-simvq: soft_clamp is residual-fsq's and residual-lfq's");
  LOCKSTEP_CHECK_ARG(options.codebook_sizes().empty(),
                     "residual-simvq: codebook_sizes is residual-vq's (its layers have no "
                     "codebook of their own size)");
  LOCKSTEP_CHECK_ARG(!options.shared_codebook() && !options.diveq() && !options.implicit_neural_codebook() &&
                         options.beam_size() <= 1 && options.eval_beam_size() <= 1,
                     "residual-simvq: shared_codebook, diveq, implicit codebooks and beam search are residual-vq's");
  std::vector<std::shared_ptr<Quantizer>> layers;
  for (int64_t l = 0; l < options.num_quantizers(); ++l) layers.push_back(std::make_shared<SimVq>(layer));
  return std::make_shared<Residual>("residual-simvq", options, layer.dim(), std::move(layers));
}

std::shared_ptr<Residual> make_residual_lfq(const ResidualOptions& options, const LfqOptions& layer) {
  LOCKSTEP_CHECK_ARG(!layer.orthogonal_rotation(), "residual-lfq: orthogonal_rotation is lfq's alone");
  LOCKSTEP_CHECK_ARG(options.codebook_sizes().empty(),
                     "residual-lfq: codebook_sizes is residual-vq's (its layers have no "
                     "codebook of their own size)");
  LOCKSTEP_CHECK_ARG(!options.shared_codebook() && !options.diveq() && !options.implicit_neural_codebook() &&
                         options.beam_size() <= 1 && options.eval_beam_size() <= 1,
                     "residual-lfq: shared_codebook, diveq, implicit codebooks and beam search are residual-vq's");
  int64_t bits = 0;
  while ((int64_t{1} << bits) < layer.codebook_size()) ++bits;
  const int64_t layer_dim = bits * layer.num_codebooks();
  LOCKSTEP_CHECK_ARG(options.soft_clamp().size() <= 1, "residual-lfq: soft_clamp takes one value, got ",
                     options.soft_clamp().size());
  std::vector<std::shared_ptr<Quantizer>> layers;
  for (int64_t l = 0; l < options.num_quantizers(); ++l) {
    LfqOptions each =
        LfqOptions(layer).dim(layer_dim).codebook_scale(layer.codebook_scale() * std::ldexp(1.0, -static_cast<int>(l)));
    // As the reference: each layer's soft clamp halves, as its codebook scale does.
    if (!options.soft_clamp().empty()) each.soft_clamp(options.soft_clamp()[0] * std::ldexp(1.0, -static_cast<int>(l)));
    layers.push_back(std::make_shared<Lfq>(each));
  }
  return std::make_shared<Residual>("residual-lfq", options, layer.dim().value_or(layer_dim), std::move(layers));
}

}  // namespace lockstep::quant
