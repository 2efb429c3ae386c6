// torch.distributed's collectives through lockstep's channel without waiting for the check
// (lockstep.distributed, docs/distributed.md "What the check costs"): the caller gets a c10d::Work at
// once; the channel's worker checks the collective in its turn and then issues it on the wrapped
// process group, in the same order on every rank. No Python runs on the worker, and no host thread
// waits for a device. LibTorch 2 only (the Python package's).
#pragma once

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <string>
#include <vector>

#include "lockstep/dist/backward_reducer.h"

namespace lockstep::dist {

// What every rank must agree on before a foreign collective runs (check_foreign_collective's
// arguments): its name as reported, the tensors whose specs must match, and where it was called.
struct ForeignCall {
  std::string op;  // "all_reduce(sum)"
  std::vector<at::Tensor> compared;
  std::string tag, file;
  int line = 0;
  bool compare_site = false;
};

// `inner`'s all_reduce of `tensors` with `options`, issued by the channel's worker once every rank
// agreed on `call`. The Work's wait() and future complete with `inner`'s; a failed check fails them
// with its CollectiveMismatch or CollectiveFailure (raise_if_check_failed names it as it is).
c10::intrusive_ptr<c10d::Work> all_reduce_after_check(LazyGroup& channel, ForeignCall call,
                                                      c10::intrusive_ptr<c10d::ProcessGroup> inner,
                                                      std::vector<at::Tensor> tensors,
                                                      const c10d::AllreduceOptions& options);

// For a Work that all_reduce_after_check returned: waits until its check ran and rethrows its error,
// if any; true. False, at once, for any other Work.
bool raise_if_check_failed(c10d::Work& work);

}  // namespace lockstep::dist
#endif
