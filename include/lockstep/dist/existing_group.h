// A checked group (G1, G2) over a process group the caller already has: torch.distributed's,
// handed over from Python, with any backend. Fingerprints and CPU tensors travel on the group's
// built-in Gloo backend when it has one, else on a Gloo group of lockstep's own met through `store`
// (an NCCL-only group, a backend registered with torch.distributed.Backend.register_backend); CUDA
// tensors travel on the group's NCCL backend and stay on the device. The heartbeats and statuses go to
// `store` (the group's rendezvous store) under `prefix`, so that several lockstep groups can share one.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <torch/version.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/group.h"

namespace lockstep::dist {

// Makes a Gloo group from a store prefix (a rendezvous): torch's ProcessGroupGloo, a c10d::Backend
// in LibTorch 2 and a c10d::ProcessGroup in 1.13.
#if TORCH_VERSION_MAJOR >= 2
using GlooMaker = std::function<c10::intrusive_ptr<c10d::Backend>(const std::string& prefix)>;
#else
using GlooMaker = std::function<c10::intrusive_ptr<c10d::ProcessGroup>(const std::string& prefix)>;
#endif

struct ExistingGroupOptions {
  std::string prefix = "lockstep";  // must be the same on every rank, and differ between groups
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // What the group is (its members as the caller numbers them), for errors: "rank 0 of 2 (<name>)".
  std::string name;
  // The members' ranks in the whole job, in the group's order (CheckedGroupOptions::global_ranks).
  std::vector<int> global_ranks;
  // Makes lockstep's own Gloo group for a process group without a built-in one, or for own_gloo (LibTorch
  // 2). Unset: lockstep makes it itself, which needs Gloo's headers at build time; the Python package
  // built without them hands torch's ProcessGroupGloo over instead.
  GlooMaker make_gloo;
  // A Gloo group of lockstep's own even where the process group has a built-in one: lockstep.distributed's
  // channel, whose fingerprint exchanges must not queue behind the data it issues on the group's backend.
  bool own_gloo = false;
  bool predict = true;  // CheckedGroupOptions::predict: repeated calls are checked on the prediction
};

// A rendezvous: every rank of the group must call it. Throws CollectiveFailure when lockstep's own
// Gloo group cannot connect every rank.
std::shared_ptr<Group> make_group_over(c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                                       c10::intrusive_ptr<c10d::Store> store, const ExistingGroupOptions& options = {});

}  // namespace lockstep::dist
