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
  const auto params = model.named_parameters(true);
  const auto buffers = model.named_buffers(true);
  for (auto& item : average.named_parameters(true)) {
    const at::Tensor* p = params.find(item.key());
    LOCKSTEP_CHECK_ARG(p != nullptr, "weight EMA: parameter '", item.key(), "' of the average is not in the model");
    check_same("parameter", item.key(), item.value(), *p);
    if (item.value().is_floating_point()) {
      item.value().mul_(decay).add_(*p, 1 - decay);
    } else {
      item.value().copy_(*p);
    }
  }
  for (auto& item : average.named_buffers(true)) {
    const at::Tensor* b = buffers.find(item.key());
    LOCKSTEP_CHECK_ARG(b != nullptr, "weight EMA: buffer '", item.key(), "' of the average is not in the model");
    check_same("buffer", item.key(), item.value(), *b);
    item.value().copy_(*b);
  }
  LOCKSTEP_CHECK_ARG(
      params.size() == average.named_parameters(true).size() && buffers.size() == average.named_buffers(true).size(),
      "weight EMA: the model has ", params.size(), " parameters and ", buffers.size(), " buffers, the average ",
      average.named_parameters(true).size(), " and ", average.named_buffers(true).size());
}

}  // namespace lockstep::train
