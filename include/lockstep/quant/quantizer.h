// The interface every quantizer implements (FAISS's Quantizer in spirit: encode, decode, and a
// forward for training), as a torch module whose buffers are its explicit state.
#pragma once

#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/quant/reduce.h"

namespace lockstep::quant {

// What the caller hands a quantizer for one forward.
struct QuantizeContext {
  // Sums statistics over the global batch; null means this process holds all of it.
  Reducer* reducer = nullptr;
  // Randomness that must agree across ranks: seeded once and advanced by step counters by the
  // caller. Undefined means the quantizer must not need randomness.
  at::Generator generator;
  // Index in the global batch of this holder's first item (b). Per-token randomness (FSQ noise
  // dropout, VQ's sampled codes, LFQ's entropy subset) is keyed by a token's global position, so
  // W holders draw exactly what one process holding the whole batch draws, and different holders
  // draw independently.
  int64_t first_item = 0;
  // Training state (EMA codebooks, dead codes) is not updated in quantize but handed back as
  // QuantizerOutput::update, for the caller to run later with a reducer (the Python modules run it
  // in backward, so that a forward never communicates). k-means initialisation still runs in quantize.
  bool defer_updates = false;
  // With defer_updates: the update is made (and handed back) under no_grad too, for a caller that runs it at
  // once, a whole training step in forward. Otherwise a deferred training call under no_grad, which no
  // backward follows, changes nothing (not even k-means initialisation).
  bool whole_step = false;
  // (b, n) bool: the tokens that count, for batches of padded sequences; undefined means all. A
  // masked token counts in no statistic (EMA, k-means, dead codes, entropy) and no loss; what its
  // output is, and whether a quantizer takes a mask at all, is its mask_support().
  at::Tensor mask = {};
  // A training call that leaves the codebooks as they are (no EMA, no dead codes; k-means
  // initialisation still runs), its commitment loss detached from them. Quantizers without a
  // codebook to keep have nothing to freeze.
  bool freeze_codebook = false;
  // The codes the call quantizes to, computed by the caller through a module of the user's from the
  // quantizer's own state (SimVQ's codebook_transform of its frozen codes); undefined: the quantizer's
  // own. SimVq and Vq take one (K, dim) or (C, K, cd); residual-simvq one per layer, stacked.
  at::Tensor codebook = {};
  // Residual stacks: layer l's codes made by the caller when the layer comes, after its k-means
  // initialisation (ResidualVQ's vq_bridge reads the codebook k-means set from the layer's residual); in
  // place of `codebook`. Empty: `codebook`, or the layers' own.
  std::function<at::Tensor(int64_t layer)> layer_codebook = {};
  // VQ's sampling temperature for this call in place of the option's (the reference's forward
  // sample_codebook_temp); unset: the option's.
  std::optional<double> sample_codebook_temp = std::nullopt;
  // LFQ's inverse temperature of the code probabilities for this call in place of the option's (the
  // reference's forward inv_temperature); unset: the option's.
  std::optional<double> inv_temperature = std::nullopt;
  // FSP's clamp epsilon for this call (the reference's forward eps): activations are clamped below 1 - eps
  // before binning, and to [eps, 1 - eps] before need_inv_act's inverse; unset: float32's machine epsilon.
  std::optional<double> fsp_eps = std::nullopt;
  // Residual quantize dropout: in a training call, the number of layers run (>= 1), as the caller chose it
  // (the reference's rand_quantize_dropout_fixed_seed); 0: drawn from the generator.
  int64_t dropout_layers = 0;

  // Whether a call in `training` may change state: at once, or by an update that backward (or the caller) runs.
  bool may_change_state(bool training) const {
    return training && (!defer_updates || whole_step || at::GradMode::is_enabled());
  }
};

struct QuantizerOutput {
  at::Tensor quantized;                      // same shape as the input; its gradient follows the quantizer's estimator
  at::Tensor indices;                        // int64: (b, n) or (b, n, num_indices())
  std::map<std::string, at::Tensor> losses;  // named scalar losses, already weighted
  // With QuantizeContext::defer_updates: the training call's state update, to run once (its
  // collectives go through the reducer it is given); empty when the call changes no state.
  std::function<void(Reducer&)> update;

  // Sum of `losses` (a zero scalar when there are none).
  at::Tensor total_loss() const;
};

// How a quantizer treats QuantizeContext::mask (as vector-quantize-pytorch's classes do).
enum class MaskSupport {
  Refused,              // InvalidArgument naming the quantizer (check_no_mask)
  StatisticsOnly,       // padding quantized as any token, kept out of statistics and losses (LFQ)
  StatisticsAndOutput,  // also its output 0 and its indices -1 (VQ)
};

class Quantizer : public torch::nn::Module {
 public:
  explicit Quantizer(const std::string& name) : torch::nn::Module(name) {}

  virtual std::string kind() const = 0;              // registry name, e.g. "fsq"
  virtual int64_t dim() const = 0;                   // size of each input token vector
  virtual int64_t codebook_size() const = 0;         // codes available to each index
  virtual int64_t num_indices() const { return 1; }  // indices per token
  virtual MaskSupport mask_support() const { return MaskSupport::Refused; }
  // Whether a training call draws per-token randomness keyed by QuantizeContext::first_item (FSQ
  // noise, sampled codes, LFQ's entropy subset, ...): then holders with unequal batches, each placing
  // its first item at rank x its own batch, would draw overlapping, shifted values. From the options.
  virtual bool draws_per_item() const { return false; }

  // x: (b, n, dim). Training behaviour (statistics, randomness) only in training mode.
  virtual QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) = 0;
  // x: (b, n, dim) -> int64 indices (b, n) or (b, n, num_indices()); never changes state.
  virtual at::Tensor encode(const at::Tensor& x) = 0;
  // indices as returned by encode -> (b, n, dim) vectors equal to quantize's forward value.
  virtual at::Tensor decode(const at::Tensor& indices) = 0;
};

// The mask of `ctx`, checked against tokens x (b, n, d) and returned as bool; undefined when there is none.
at::Tensor checked_mask(const QuantizeContext& ctx, const at::Tensor& x, const std::string& kind);
// InvalidArgument naming `kind` when `ctx` carries a mask: for quantizers that do not take one.
void check_no_mask(const QuantizeContext& ctx, const std::string& kind);
// Output (b, n, d) with the masked tokens' vectors 0 and indices (b, n[, k]) with theirs -1 (for
// MaskSupport::StatisticsAndOutput).
void apply_mask(const at::Tensor& mask, at::Tensor& quantized, at::Tensor& indices);

// Images (b, dim, h, w) as tokens (b, h*w, dim) and back.
at::Tensor image_to_tokens(const at::Tensor& x);
at::Tensor tokens_to_image(const at::Tensor& tokens, int64_t height, int64_t width);

}  // namespace lockstep::quant
