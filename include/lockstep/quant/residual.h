// Residual quantization (Zeghidour et al. 2021; Lee et al. 2022): Q layers each quantize what the
// previous ones left, r_0 = x, q_l = Q_l(r_{l-1} / s_l) * s_l, r_l = r_{l-1} - q_l (detached), output
// sum q_l. As docs/quantizers.md section "Residual variants"; make_residual_vq/fsq/lfq/simvq build
// the kinds the registry offers.
#pragma once

#include <torch/nn/modules/linear.h>

#include <memory>
#include <vector>

#include "lockstep/quant/fsq.h"
#include "lockstep/quant/implicit_codebook.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/option_fields.h"
#include "lockstep/quant/quantizer.h"
#include "lockstep/quant/simvq.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {

struct ResidualOptions {
  explicit ResidualOptions(int64_t num_quantizers) : num_quantizers_(num_quantizers) {}

  // residual-vq: the beam in evaluation (Residual::quantize_beam); unset or 0 means beam_size.
  int64_t eval_beam_size() const { return eval_beam_size_.value_or(0) > 0 ? *eval_beam_size_ : beam_size_; }

  // Every option: residual_options.def, one line each (option_fields.h).
#define LOCKSTEP_OPTIONS ResidualOptions
#define LOCKSTEP_OPTIONS_FIELDS "lockstep/quant/residual_options.def"
#include "lockstep/quant/option_fields.inc"

  // Throws InvalidArgument with the value: a field outside its limits, num_quantizers < 1, a cutoff
  // index beyond the last layer, codebook_sizes or beam_score_weights neither empty nor one per layer, a
  // negative eval_beam_size.
  void validate() const;
};

class Residual final : public Quantizer {
 public:
  // `layers` all take vectors of the same size, `layer_dim`; the input (dim) is projected to it when
  // the two differ. scales: empty (all 1) or one tensor per layer broadcastable to (layer_dim).
  // input_clamp: undefined, or c broadcastable to (layer_dim): the projected input is first squashed
  // to tanh(z / c) * c (residual FSQ with a hard-clamped bound).
  // projections: the input's (dim -> layer_dim) and the output's, made here when not given (a factory whose
  // layers draw initial values makes them first, in the reference's order of draws).
  Residual(std::string kind, ResidualOptions options, int64_t dim, std::vector<std::shared_ptr<Quantizer>> layers,
           std::vector<at::Tensor> scales = {}, at::Tensor input_clamp = {},
           std::pair<torch::nn::Linear, torch::nn::Linear> projections = {nullptr, nullptr});

  std::string kind() const override { return kind_; }
  bool draws_per_item() const override;
  int64_t dim() const override { return dim_; }
  // The first layer's; layers may differ (ResidualOptions::codebook_sizes).
  int64_t codebook_size() const override { return layers_.front()->codebook_size(); }
  // The layers' indices side by side: (b, n, sum of their num_indices()).
  int64_t num_indices() const override { return num_indices_; }
  MaskSupport mask_support() const override { return layers_.front()->mask_support(); }

  // Losses are the layers' under "layer<l>.<name>". With quantize dropout the cutoff comes first from
  // ctx.generator (torch's default when undefined); the kept layers then see the same context.
  // With beam_size (eval_beam_size in evaluation) above 1, quantize_beam of that width.
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  // residual-vq's beam search (the reference's, after Zeghidour et al.): each of `beam` candidate paths
  // per token takes its `beam` best codes at each layer (Vq::quantize_topk), scored by minus the sum of
  // its codes' weighted commitment losses (beam_score_weights) as the layers' searches computed them
  // (VqTopk::distance), so one layer's best path is its nearest code; the `beam` best paths go on (equal
  // scores: the earlier path), the best one is the output. Losses "layer<l>.commitment" are each layer's
  // mean code loss over the tokens that count on the chosen paths; in training each layer's EMA update
  // takes the chosen path's residuals and codes (Vq::update_from). A width of 1 is quantize's greedy search.
  QuantizerOutput quantize_beam(const at::Tensor& x, const QuantizeContext& ctx, int64_t beam);
  at::Tensor encode(const at::Tensor& x) override;
  // Indices -1 (dropped layers) contribute nothing.
  at::Tensor decode(const at::Tensor& indices) override;
  // Each layer's code as it enters the sum (scaled, before the projection out), (Q, b, n, layer_dim): zeros
  // for a dropped layer (-1). With implicit neural codebooks, each from the sum of the codes before it.
  at::Tensor decode_layers(const at::Tensor& indices);

  const ResidualOptions& options() const { return options_; }
  const std::vector<std::shared_ptr<Quantizer>>& layers() const { return layers_; }

 private:
  // Number of layers this call runs: Q, or cutoff + 1 under quantize dropout in training.
  int64_t layers_to_run(const QuantizeContext& ctx) const;
  QuantizerOutput quantize_greedy(const at::Tensor& x, const QuantizeContext& ctx);
  // (the gradient's share f of) q, as the residual the next layer takes subtracts it: f q + (1 - f) sg(q).
  at::Tensor passed_on(const at::Tensor& q) const;
  // Before layer l makes its codes from `input`: a VQ layer's k-means initialisation (Vq::initialise), then
  // the caller's codes for it when it makes them (QuantizeContext::layer_codebook), set in `layer_ctx`.
  void initialise_layer(int64_t l, const at::Tensor& input, QuantizeContext& layer_ctx);
  // The update a shared codebook takes once per training call, after every layer's (Vq::refresh_update),
  // from the layers' inputs (b, n, ld) each; empty when the codebook is not shared.
  std::function<void(Reducer&)> shared_refresh(const std::vector<at::Tensor>& inputs, const QuantizeContext& ctx);
  // The input in the layers' space: projected, then squashed when there is an input clamp.
  at::Tensor to_layer_space(const at::Tensor& x);

  std::string kind_;
  ResidualOptions options_;
  int64_t dim_;
  int64_t num_indices_ = 0;
  std::vector<std::shared_ptr<Quantizer>> layers_;
  std::vector<at::Tensor> scales_;
  at::Tensor input_clamp_;  // derived from the layers' options, so not a buffer (nor in checkpoints)
  torch::nn::Linear project_in_{nullptr};
  torch::nn::Linear project_out_{nullptr};
  std::vector<ImplicitCodebook> mlps_;  // layers 1..Q-1's, with implicit_neural_codebook
};

// Q VQ layers of `layer` options (each its own codebook, drawn in turn from `generator`, or one for
// every layer with options.shared_codebook()), of options.codebook_sizes() codes each when given.
std::shared_ptr<Residual> make_residual_vq(const ResidualOptions& options, const VqOptions& layer,
                                           at::Generator generator = {});
// Q FSQ layers with the symmetric bound; layer l sees the residual divided by levels^-l per dimension
// (docs/quantizers.md). The input is projected to len(levels) when `layer` sets another dim.
std::shared_ptr<Residual> make_residual_fsq(const ResidualOptions& options, const FsqOptions& layer);
// Q LFQ layers; layer l uses codebook_scale * 2^-l. The input is projected to log2 K when `layer`
// sets another dim.
std::shared_ptr<Residual> make_residual_lfq(const ResidualOptions& options, const LfqOptions& layer);
// Q SimVQ layers, each with its own frozen codebook and map (drawn in turn from torch's default
// generator, as the reference's layers), on the residual itself (scale 1).
std::shared_ptr<Residual> make_residual_simvq(const ResidualOptions& options, const SimVqOptions& layer);

}  // namespace lockstep::quant
