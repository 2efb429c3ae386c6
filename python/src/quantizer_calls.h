// What the Quantizer's bindings share (quantizer_bindings.cpp binds the class, compiled_calls.cpp the calls
// torch.compile's custom ops make): one call of a quantizer as the Python modules make it, and its state update.
#pragma once

#include <torch/extension.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/dist/backward_reducer.h"
#include "lockstep/quant/quantizer.h"
#include "lockstep/quant/vq.h"

namespace lockstep::dist {
class LazyGroup;
}

namespace lockstep::python {

using lockstep::quant::Quantizer;

// One call's own arguments, the reference's forward arguments and lockstep's (lockstep._C.Call): each changes
// this call only; the defaults make the plain call.
struct CallOptions {
  std::optional<at::Tensor> mask;      // (b, n) bool: padding, kept out of statistics and losses
  bool freeze_codebook = false;        // the codebooks stay as they are
  std::optional<at::Tensor> codebook;  // codes of a module of the user's (SimVQ's codebook_transform, a vq_bridge)
  std::optional<int64_t> beam_size;    // residual-vq: this call's beam search width
  std::optional<lockstep::quant::VqUpdate> vq_update;  // VQ: this call's EMA update arguments
  std::optional<double> sample_codebook_temp;          // VQ: the sampling temperature in place of the option's
  std::optional<double> inv_temperature;               // LFQ: the inverse temperature in place of the option's
  int64_t dropout_layers = 0;                          // residual quantize dropout: the layers run (0: drawn)
  // VQ: each token's own codes (b * n, K, codebook_dim), differentiable (the reference's codebook_transform_fn).
  std::optional<at::Tensor> token_codes;
  // Residual stacks: each layer's codes made when the layer comes (QuantizeContext::layer_codebook).
  std::function<at::Tensor(int64_t)> layer_codebook;
  std::optional<double> fsp_eps;  // FSP: the clamp epsilon in place of float32's machine epsilon
  // A training call that is a whole step: its state updates run in the call (over the group), not deferred.
  bool update_in_forward = false;
};

// A training call's batch, to be compared across the group's ranks in backward when the quantizer
// draws per-token randomness keyed by rank x batch (Quantizer::draws_per_item); else local_batch -1.
struct BatchCheck {
  int64_t local_batch = -1;
  std::string kind;
};

// The randomness and placement of one call as the Python modules make it: draws from (seed, step); with
// a group, equal batches on every rank put this rank's first item at rank * b in the global batch.
lockstep::quant::QuantizeContext call_context(const at::Tensor& x, uint64_t seed, const at::Tensor& step,
                                              const std::shared_ptr<lockstep::dist::LazyGroup>& group,
                                              const std::optional<at::Tensor>& mask);

// A training call's reducer, set as ctx.reducer: its collectives (k-means in forward, the update in backward)
// over `group`, declared for the step the call completes; none without a group. It must outlive the call.
std::unique_ptr<lockstep::dist::BackwardReducer> training_reducer(
    lockstep::quant::QuantizeContext& ctx, const std::shared_ptr<lockstep::dist::LazyGroup>& group,
    const at::Tensor& step);

// A training call's state updates and their collectives made to wait for backward (G3,
// dist/backward_reducer.h: ctx.defer_updates), with its training_reducer; nothing in evaluation (null).
// With `in_forward` the update is made under no_grad too (ctx.whole_step), for the caller to run at once.
std::unique_ptr<lockstep::dist::BackwardReducer> defer_training_updates(
    lockstep::quant::QuantizeContext& ctx, bool training, const std::shared_ptr<lockstep::dist::LazyGroup>& group,
    const at::Tensor& step, bool in_forward = false);

// One call of the quantizer as the Python modules make it: randomness a pure function of (seed,
// step), step counting the backwards that updated the module (every rank agrees with no collective,
// docs/python/distributed.md); in training, state updates and their collectives wait for backward.
lockstep::quant::QuantizerOutput quantize_call(Quantizer& q, const at::Tensor& x, bool training, uint64_t seed,
                                               const at::Tensor& step,
                                               const std::shared_ptr<lockstep::dist::LazyGroup>& group,
                                               const CallOptions& call = {});

// The end of a training call: with `in_forward` (a whole step) its `update` runs and the step advances now; else,
// with gradients, both wait for backward. With gradients `outputs` come back behind one autograd node (with
// nothing to run after a whole step), so that a loss has a gradient function whatever the input.
std::vector<at::Tensor> finish_training_call(Quantizer& q, const at::Tensor& x, std::vector<at::Tensor> outputs,
                                             std::function<void(lockstep::quant::Reducer&)> update, bool in_forward,
                                             const std::shared_ptr<lockstep::dist::LazyGroup>& group,
                                             const at::Tensor& step);

// The BatchCheck of a call (local_batch -1 where none is needed).
BatchCheck batch_check(const Quantizer& q, const at::Tensor& x, bool training,
                       const std::shared_ptr<lockstep::dist::LazyGroup>& group);

// A training step's deferred state update, reduced over `group` (or this process alone), then
// `step` advanced. Errors keep their Python types through autograd (translate_for_autograd).
void apply_update(const std::function<void(lockstep::quant::Reducer&)>& update,
                  const std::shared_ptr<lockstep::dist::LazyGroup>& group, at::Tensor step,
                  const BatchCheck& check = {});

// Loss `name` of a call, or a zero scalar where this call has none (a dropped residual layer).
at::Tensor loss_or_zero(const lockstep::quant::QuantizerOutput& out, const std::string& name, const at::Tensor& x);

}  // namespace lockstep::python
