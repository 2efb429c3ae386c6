// Quantizer statistics summed over a process group: the quant::Reducer the trainer hands each
// quantizer when it runs on several ranks. Every call is one checked collective (G1), and on
// several ranks it needs a declared phase (PhaseScope): without one, a forward run on some ranks
// only would pair with another rank's step, so it is refused (InvalidArgument) before anything moves.
#pragma once

#include <memory>

#include "lockstep/dist/group.h"
#include "lockstep/quant/reduce.h"

namespace lockstep::dist {

class GroupReducer final : public quant::Reducer {
 public:
  explicit GroupReducer(std::shared_ptr<Group> group) : group_(std::move(group)) {}

  // One all_reduce(sum) of all the tensors, at the quantizer's call site.
  void sum_(std::vector<at::Tensor>& tensors, const CallSite& site) override;
  // all_reduce(sum) forward; backward all-reduces the incoming gradient (tag + ".backward", same
  // file and line), so that with gradients averaged over ranks each rank's inputs get exactly their
  // single-process gradient.
  at::Tensor sum(const at::Tensor& local, const CallSite& site) override;
  // Two all_gathers at the caller's file and line: the row counts (tag + ".rows"), then the rows
  // padded to the longest (tag).
  at::Tensor gather(const at::Tensor& local, const CallSite& site) override;

 private:
  void require_declared_phase(const CallSite& site) const;
  std::shared_ptr<Group> group_;
};

}  // namespace lockstep::dist
