#include "lockstep/train/losses.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::train {

at::Tensor reconstruction_loss(const at::Tensor& reconstruction, const at::Tensor& x,
                               const ReconstructionLossOptions& options, model::LpipsImpl* lpips) {
  LOCKSTEP_CHECK_ARG(options.perceptual_ <= 0 || lpips != nullptr, "loss: perceptual weight ", options.perceptual_,
                     " without an LPIPS network (loss.lpips_weights)");
  at::Tensor loss;
  auto add = [&loss](const at::Tensor& term) { loss = loss.defined() ? loss + term : term; };
  // The default (L2 alone, weight 1) is torch's mse_loss unchanged: runs from before these options train as they did.
  if (options.l2_ > 0)
    add(options.l2_ == 1.0 ? torch::mse_loss(reconstruction, x) : torch::mse_loss(reconstruction, x) * options.l2_);
  if (options.l1_ > 0) add(torch::l1_loss(reconstruction, x) * options.l1_);
  if (options.perceptual_ > 0) add(lpips->forward(reconstruction, x).mean() * options.perceptual_);
  return loss.defined() ? loss : torch::zeros({}, reconstruction.options());
}

}  // namespace lockstep::train
