#include "lockstep/train/weight_ema.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {
void check_same(const std::string& what, const std::string& name, const at::Tensor& a, const at::Tensor& b) {
  LOCKSTEP_CHECK_ARG(a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type(), "weight EMA: ", what, " '", name,
                     "' is ", a.scalar_type(), " ", a.sizes(), " in the average but ", b.scalar_type(), " ", b.sizes(),
                     " in the model");
}
}  // namespace

void update_weight_ema(torch::nn::Module& average, const torch::nn::Module& model, double decay) {
  LOCKSTEP_CHECK_ARG(decay >= 0 && decay < 1, "weight EMA: decay = ", decay, " must lie in [0, 1)");
  torch::NoGradGuard no_grad;
  const auto params = model.named_parameters(true), averaged = average.named_parameters(true);
  const auto buffers = model.named_buffers(true), copies = average.named_buffers(true);
  LOCKSTEP_CHECK_ARG(params.size() == averaged.size() && buffers.size() == copies.size(), "weight EMA: the model has ",
                     params.size(), " parameters and ", buffers.size(), " buffers, the average ", averaged.size(),
                     " and ", copies.size());
  // Every pair is checked before anything changes: a mismatch leaves the average as it was.
  for (const auto* pairs : {&averaged, &copies}) {
    const auto& sources = pairs == &averaged ? params : buffers;
    for (const auto& item : *pairs) {
      const at::Tensor* source = sources.find(item.key());
      LOCKSTEP_CHECK_ARG(source != nullptr, "weight EMA: '", item.key(), "' of the average is not in the model");
      check_same(pairs == &averaged ? "parameter" : "buffer", item.key(), item.value(), *source);
    }
  }
  for (const auto& item : averaged) {
    const at::Tensor& p = params[item.key()];
    if (item.value().is_floating_point()) {
      item.value().mul_(decay).add_(p, 1 - decay);
    } else {
      item.value().copy_(p);
    }
  }
  for (const auto& item : copies) item.value().copy_(buffers[item.key()]);
}

}  // namespace lockstep::train
