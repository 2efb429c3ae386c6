#include "lockstep/train/adam.h"

#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::train {

Adam::Adam(std::vector<std::pair<std::string, at::Tensor>> params, AdamOptions options) : options_(options) {
  LOCKSTEP_CHECK_ARG(options_.lr_ > 0, "adam: lr = ", options_.lr_, " must be > 0");
  LOCKSTEP_CHECK_ARG(options_.beta1_ >= 0 && options_.beta1_ < 1 && options_.beta2_ >= 0 && options_.beta2_ < 1,
                     "adam: betas (", options_.beta1_, ", ", options_.beta2_, ") must lie in [0, 1)");
  LOCKSTEP_CHECK_ARG(options_.weight_decay_ >= 0, "adam: weight_decay = ", options_.weight_decay_, " must be >= 0");
  for (auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    slots_.push_back({name, p, torch::zeros_like(p), torch::zeros_like(p)});
  }
}

void Adam::zero_grad() {
  for (auto& s : slots_) {
    if (s.param.grad().defined()) s.param.mutable_grad().zero_();
  }
}

void Adam::step() {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bc1 = 1 - std::pow(options_.beta1_, static_cast<double>(steps_));
  const double bc2 = 1 - std::pow(options_.beta2_, static_cast<double>(steps_));
  for (auto& s : slots_) {
    const at::Tensor& g = s.param.grad();
    if (!g.defined()) continue;
    if (options_.weight_decay_ != 0) s.param.mul_(1 - options_.lr_ * options_.weight_decay_);
    s.exp_avg.mul_(options_.beta1_).add_(g, 1 - options_.beta1_);
    s.exp_avg_sq.mul_(options_.beta2_).addcmul_(g, g, 1 - options_.beta2_);
    const at::Tensor denom = (s.exp_avg_sq / bc2).sqrt_().add_(options_.eps_);
    s.param.addcdiv_(s.exp_avg, denom, -options_.lr_ / bc1);
  }
}

std::map<std::string, at::Tensor> Adam::state() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& s : slots_) {
    out["exp_avg." + s.name] = s.exp_avg;
    out["exp_avg_sq." + s.name] = s.exp_avg_sq;
  }
  return out;
}

void Adam::load_state(const std::map<std::string, at::Tensor>& state, int64_t steps) {
  // Bias correction raises beta to the step count; beyond 2^53 the count is no longer exact as a
  // double, and one more step would overflow int64 (no real run gets near either).
  LOCKSTEP_THROW_IF_NOT(steps >= 0 && steps < (int64_t{1} << 53), CorruptInput, "adam: step count ", steps,
                        " is outside [0, 2^53)");
  LOCKSTEP_THROW_IF_NOT(state.size() == 2 * slots_.size(), CorruptInput, "optimizer state has ", state.size(),
                        " tensors, but this model's optimizer has ", 2 * slots_.size(),
                        " (exp_avg and exp_avg_sq per parameter)");
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    const std::pair<std::string, at::Tensor*> parts[] = {{"exp_avg." + s.name, &s.exp_avg},
                                                         {"exp_avg_sq." + s.name, &s.exp_avg_sq}};
    for (const auto& [key, dst] : parts) {
      auto it = state.find(key);
      LOCKSTEP_THROW_IF_NOT(it != state.end(), CorruptInput, "optimizer state has no tensor '", key, "'");
      LOCKSTEP_THROW_IF_NOT(it->second.sizes() == dst->sizes(), CorruptInput, "optimizer state '", key, "' has shape ",
                            it->second.sizes(), ", the model needs ", dst->sizes());
      LOCKSTEP_THROW_IF_NOT(it->second.scalar_type() == dst->scalar_type(), CorruptInput, "optimizer state '", key,
                            "' is ", it->second.scalar_type(), ", the model needs ", dst->scalar_type());
      // Adam never writes a value that is not finite, nor a negative second moment: such a state was
      // damaged, and resuming from it would diverge (or silently stall) steps later.
      const bool second_moment = dst == &s.exp_avg_sq;
      const at::Tensor& value = it->second;
      LOCKSTEP_THROW_IF_NOT(value.isfinite().all().item<bool>(), CorruptInput, "optimizer state '", key,
                            "' holds values that are not finite: the checkpoint is damaged");
      LOCKSTEP_THROW_IF_NOT(!second_moment || value.numel() == 0 || value.min().item<double>() >= 0, CorruptInput,
                            "optimizer state '", key, "' holds negative second moments (smallest ",
                            value.min().item<double>(), "): the checkpoint is damaged");
      dst->copy_(value);
    }
  }
  steps_ = steps;
}

}  // namespace lockstep::train
