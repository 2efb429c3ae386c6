#include "lockstep/train/grad_clip.h"

#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"

namespace lockstep::train {

double global_grad_norm(const std::vector<at::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> squares;  // on the gradients' device, then one sum: one sync, not one per tensor
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) squares.push_back(p.grad().to(torch::kFloat64).square().sum());
  }
  return squares.empty() ? 0.0 : std::sqrt(torch::stack(squares).sum().item<double>());
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  LOCKSTEP_CHECK_ARG(max_norm > 0, "gradient clipping: max_norm = ", max_norm, " must be > 0");
  const double norm = global_grad_norm(params);
  if (std::isfinite(norm) && norm > max_norm) {
    torch::NoGradGuard no_grad;
    const double scale = max_norm / norm;
    for (const at::Tensor& p : params) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  return norm;
}

}  // namespace lockstep::train
