// One call of a quantizer as the Python modules make it, and its state update (quantizer_calls.h).
#include "quantizer_calls.h"

#include <string>
#include <vector>

#include "bindings.h"
#include "lockstep/core/error.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/group_reducer.h"
#include "lockstep/quant/autocast.h"
#include "lockstep/quant/call_context.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/simvq.h"

namespace lockstep::python {

namespace {
// Every rank gathers the same batch sizes, so every rank decides alike: unequal batches are refused on
// all of them at once, naming each rank's (forward cannot know the others' sizes without a collective).
void check_even_batches(lockstep::quant::Reducer& reducer, const BatchCheck& check) {
  const at::Tensor sizes =
      reducer.gather(torch::full({1}, check.local_batch, torch::kInt64), LOCKSTEP_CALL_SITE("python.batch_sizes"));
  if ((sizes == sizes[0]).all().item<bool>()) return;
  std::string listed;
  for (int64_t r = 0; r < sizes.size(0); ++r) {
    listed += lockstep::detail::concat(r ? ", " : "", "rank ", r, ": ", sizes[r].item<int64_t>(), " items");
  }
  throw lockstep::InvalidArgument(lockstep::detail::concat(
      check.kind, ": the ranks held batches of different sizes (", listed,
      ") in a training step, and this quantizer draws per-token randomness keyed by each token's place in "
      "the global batch, which lockstep takes as rank x batch size: draws would overlap and shift between "
      "ranks. Give every rank the same batch size (a sampler with drop_last=True), or turn off the option "
      "that draws (noise_dropout, stochastic_sample_codes, frac_per_sample_entropy < 1, directional_reparam, "
      "quantize_rate < 1)"));
}

// The VQ behind a quantize() call given VQ's own arguments, or InvalidArgument naming what it is instead.
lockstep::quant::Vq& as_vq(Quantizer& q) {
  auto* vq = dynamic_cast<lockstep::quant::Vq*>(&q);
  LOCKSTEP_CHECK_ARG(vq, "VQ's arguments (ema_update_weight, accumulate, ema_update, token_codes) given to a ",
                     q.kind(), " quantizer");
  return *vq;
}
}  // namespace

lockstep::quant::QuantizeContext call_context(const at::Tensor& x, uint64_t seed, const at::Tensor& step,
                                              const std::shared_ptr<lockstep::dist::LazyGroup>& group,
                                              const std::optional<at::Tensor>& mask) {
  lockstep::quant::QuantizeContext ctx = lockstep::quant::seeded_context(
      seed, static_cast<uint64_t>(step.item<int64_t>()), group ? group->rank() * x.size(0) : 0);
  if (mask) ctx.mask = *mask;
  return ctx;
}

std::unique_ptr<lockstep::dist::BackwardReducer> training_reducer(
    lockstep::quant::QuantizeContext& ctx, const std::shared_ptr<lockstep::dist::LazyGroup>& group,
    const at::Tensor& step) {
  if (!group) return nullptr;
  auto reducer = std::make_unique<lockstep::dist::BackwardReducer>(
      group, lockstep::dist::Phase::train_step(step.item<int64_t>() + 1));
  ctx.reducer = reducer.get();
  return reducer;
}

std::unique_ptr<lockstep::dist::BackwardReducer> defer_training_updates(
    lockstep::quant::QuantizeContext& ctx, bool training, const std::shared_ptr<lockstep::dist::LazyGroup>& group,
    const at::Tensor& step, bool in_forward) {
  if (!training) return nullptr;
  ctx.defer_updates = true;
  ctx.whole_step = in_forward;
  return training_reducer(ctx, group, step);
}

lockstep::quant::QuantizerOutput quantize_call(Quantizer& q, const at::Tensor& x, bool training, uint64_t seed,
                                               const at::Tensor& step,
                                               const std::shared_ptr<lockstep::dist::LazyGroup>& group,
                                               const CallOptions& call) {
  q.train(training);
  lockstep::quant::QuantizeContext ctx = call_context(x, seed, step, group, call.mask);
  ctx.freeze_codebook = call.freeze_codebook;
  ctx.sample_codebook_temp = call.sample_codebook_temp;
  ctx.inv_temperature = call.inv_temperature;
  ctx.dropout_layers = call.dropout_layers;
  ctx.layer_codebook = call.layer_codebook;
  ctx.fsp_eps = call.fsp_eps;
  if (call.codebook) {  // the codes of a module of the user's (SimVQ's codebook_transform, VQ's vq_bridge)
    LOCKSTEP_CHECK_ARG(
        dynamic_cast<lockstep::quant::SimVq*>(&q) || dynamic_cast<lockstep::quant::Vq*>(&q) ||
            q.kind() == "residual-simvq" || q.kind() == "residual-vq",
        "codes given to a ", q.kind(),
        " quantizer: only simvq, vq, residual-simvq and residual-vq (one codebook per layer) take a caller's "
        "codebook");
    ctx.codebook = *call.codebook;
  }
  const auto reducer = defer_training_updates(ctx, training, group, step, call.update_in_forward);
  // In float32 whatever torch.autocast says (quant/autocast.h).
  const lockstep::quant::NoAutocast fp32;
  const at::Tensor input = x.is_floating_point() ? x.to(at::kFloat) : x;
  if (call.token_codes) {
    LOCKSTEP_CHECK_ARG(!call.vq_update, "each token's own codes take no per-call EMA arguments");
    return as_vq(q).quantize_implicit(input, *call.token_codes, ctx);
  }
  if (call.vq_update) return as_vq(q).quantize_with(input, ctx, *call.vq_update);
  if (call.beam_size) {
    auto* residual = dynamic_cast<lockstep::quant::Residual*>(&q);
    LOCKSTEP_CHECK_ARG(residual, "a beam size given to a ", q.kind(), " quantizer, not a residual one");
    return residual->quantize_beam(input, ctx, *call.beam_size);
  }
  return q.quantize(input, ctx);
}

BatchCheck batch_check(const Quantizer& q, const at::Tensor& x, bool training,
                       const std::shared_ptr<lockstep::dist::LazyGroup>& group) {
  if (!training || !group || !q.draws_per_item()) return {};
  return {x.size(0), q.kind()};
}

void apply_update(const std::function<void(lockstep::quant::Reducer&)>& update,
                  const std::shared_ptr<lockstep::dist::LazyGroup>& group, at::Tensor step, const BatchCheck& check) {
  try {
    if (group && (update || check.local_batch >= 0)) {
      // The step this update completes, declared for its collectives (GroupReducer requires one).
      const std::shared_ptr<lockstep::dist::Group> g = group->get();
      const lockstep::dist::PhaseScope phase(*g, lockstep::dist::Phase::train_step(step.item<int64_t>() + 1));
      lockstep::dist::GroupReducer reducer(g);
      if (check.local_batch >= 0) check_even_batches(reducer, check);
      if (update) update(reducer);
    } else if (update) {
      lockstep::quant::LocalReducer local;
      update(local);
    }
  } catch (...) {
    translate_for_autograd(std::current_exception());
    throw;
  }
  step.add_(1);
}

std::vector<at::Tensor> finish_training_call(Quantizer& q, const at::Tensor& x, std::vector<at::Tensor> outputs,
                                             std::function<void(lockstep::quant::Reducer&)> update, bool in_forward,
                                             const std::shared_ptr<lockstep::dist::LazyGroup>& group,
                                             const at::Tensor& step) {
  const BatchCheck check = batch_check(q, x, true, group);
  if (in_forward) apply_update(update, group, step, check);
  if (!at::GradMode::is_enabled()) return outputs;
  std::function<void()> on_backward;
  if (!in_forward) {
    on_backward = [keep = q.shared_from_this(), deferred = std::move(update), group, step, check]() {
      apply_update(deferred, group, step, check);
    };
  }
  const at::Tensor anchor = torch::zeros({}, x.options().dtype(at::kFloat)).requires_grad_(true);
  return lockstep::dist::run_on_backward(outputs, anchor, std::move(on_backward));
}

at::Tensor loss_or_zero(const lockstep::quant::QuantizerOutput& out, const std::string& name, const at::Tensor& x) {
  const auto found = out.losses.find(name);
  return found != out.losses.end() ? found->second : torch::zeros({}, x.options().dtype(at::kFloat));
}

}  // namespace lockstep::python
