// The reconstruction objective: weighted L2, L1 and LPIPS terms, each a mean over the batch, so
// that a rank's loss weighted by its share of the global batch averages to the global one (G4).
#pragma once

#include <ATen/core/Tensor.h>

#include "lockstep/model/lpips.h"

namespace lockstep::train {

struct ReconstructionLossOptions {
  ReconstructionLossOptions& l2(double w) {
    l2_ = w;
    return *this;
  }
  ReconstructionLossOptions& l1(double w) {
    l1_ = w;
    return *this;
  }
  ReconstructionLossOptions& perceptual(double w) {
    perceptual_ = w;
    return *this;
  }
  double l2_ = 1.0, l1_ = 0.0, perceptual_ = 0.0;
};

// reconstruction, x: (b, c, h, w) in [-1, 1]. Terms of weight 0 are not computed. `lpips` is
// needed (InvalidArgument otherwise) when the perceptual weight is positive.
at::Tensor reconstruction_loss(const at::Tensor& reconstruction, const at::Tensor& x,
                               const ReconstructionLossOptions& options, model::LpipsImpl* lpips);

}  // namespace lockstep::train
