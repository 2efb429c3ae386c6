// The transports between processes, each set up through the rendezvous store: Gloo (CPU tensors)
// and NCCL (CUDA tensors). Internal to src/dist.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <memory>

#include "lockstep/dist/process_group.h"
#include "transport.h"

namespace lockstep::dist {

// A backend's own timer is a backstop only: the checked channel enforces the timeout, counted from
// the last progress another rank published, so an operation may rightly wait longer than `timeout`.
inline std::chrono::milliseconds backstop_timeout(std::chrono::milliseconds timeout) {
  return std::max<std::chrono::milliseconds>(timeout * 10, std::chrono::hours(1));
}

// Gloo over TCP; connecting every pair ends within options.connect_timeout. Throws
// CollectiveFailure when it cannot, InvalidArgument in a build without Gloo.
std::unique_ptr<Transport> make_gloo_transport(const c10::intrusive_ptr<c10d::Store>& store,
                                               const GroupOptions& options);

// NCCL on CUDA device options.cuda_device. Throws InvalidArgument in a build without NCCL, or
// when the device does not exist.
std::unique_ptr<Transport> make_nccl_transport(const c10::intrusive_ptr<c10d::Store>& store,
                                               const GroupOptions& options);

}  // namespace lockstep::dist
