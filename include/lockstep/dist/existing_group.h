// A checked group (G1, G2) over a process group the caller already has: torch.distributed's,
// handed over from Python. Its CPU backend (Gloo) carries the fingerprints and the tensors; the
// heartbeats and statuses go to `store` (the group's rendezvous store) under `prefix`, so that
// several lockstep groups can share one store.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/dist/group.h"

namespace lockstep::dist {

struct ExistingGroupOptions {
  std::string prefix = "lockstep";  // must be the same on every rank, and differ between groups
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// Throws InvalidArgument when the process group has no CPU backend (Gloo).
std::shared_ptr<Group> make_group_over(c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                                       c10::intrusive_ptr<c10d::Store> store, const ExistingGroupOptions& options = {});

}  // namespace lockstep::dist
