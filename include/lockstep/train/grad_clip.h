// Gradient clipping by global norm. After the gradient all-reduce every rank holds the same
// gradients, so every rank computes the same norm (summed in float64 in one fixed order) and
// scales identically: no collective, and W ranks clip exactly as one process.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace lockstep::train {

// The global L2 norm of the gradients of `params` (those without one count as zero; all gradients on
// one device, as the trainer's are).
double global_grad_norm(const std::vector<at::Tensor>& params);
// Scales every gradient by max_norm / norm when the global norm exceeds max_norm (> 0); returns the
// norm before clipping. A non-finite norm leaves the gradients as they are (the loss check reports it).
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace lockstep::train
