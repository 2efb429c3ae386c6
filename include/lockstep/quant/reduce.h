// The only communication a quantizer sees: summing (count, sum) statistics over everyone who
// holds part of the global batch. Quantizers call it the same number of times whatever their
// data; the trainer plugs a process group in (dist::GroupReducer), a single process uses LocalReducer.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "lockstep/core/call_site.h"

namespace lockstep::quant {

class Reducer {
 public:
  virtual ~Reducer() = default;
  // In place, not differentiable: each tensor becomes its sum over all holders of the batch.
  // `site` (the quantizer's own LOCKSTEP_CALL_SITE) names the call in fingerprints and errors.
  // All tensors of one call travel together.
  virtual void sum_(std::vector<at::Tensor>& tensors, const CallSite& site) = 0;
  // Differentiable global sum: the gradient of the result reaches every holder's `local`.
  virtual at::Tensor sum(const at::Tensor& local, const CallSite& site) = 0;
  // Not differentiable: every holder's `local` (n_h, ...) concatenated along dim 0 in holder order,
  // which is the order of the global batch; holders may hold different n_h, including 0.
  virtual at::Tensor gather(const at::Tensor& local, const CallSite& site) = 0;
  // f of the global sum of `local`, differentiable through `local`. Here: sum (a collective now),
  // then f. A reducer that communicates only in backward (dist::BackwardReducer, the Python
  // modules') returns f(local) and gives `local` the gradient of f at the global sum.
  virtual at::Tensor apply_to_sum(const at::Tensor& local, const std::function<at::Tensor(const at::Tensor&)>& f,
                                  const CallSite& site) {
    return f(sum(local, site));
  }
};

// This process holds the whole batch: sums are identities.
class LocalReducer final : public Reducer {
 public:
  void sum_(std::vector<at::Tensor>&, const CallSite&) override {}
  at::Tensor sum(const at::Tensor& local, const CallSite&) override { return local; }
  at::Tensor gather(const at::Tensor& local, const CallSite&) override { return local; }
};

}  // namespace lockstep::quant
