// How ranks of separate processes find each other: rank 0 hosts a TCP store at the master's
// address, every rank claims its rank number there and checks that all agree on the world size.
// The store then carries the transports' own set-up and the heartbeats. Internal to src/dist.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/dist/process_group.h"

namespace lockstep::dist {

// Connects (rank 0 listens first; with master_port 0 on the kernel's choice of port, which is
// written back to options.master_port and passed to on_listening) and waits for every rank. Throws
// CollectiveFailure naming the ranks that did not arrive within connect_timeout, a rank number
// claimed twice, a world size that differs, or the master address that could not be reached.
c10::intrusive_ptr<c10d::Store> rendezvous(GroupOptions& options);

// The store holds bytes; the values lockstep puts there are text.
inline std::vector<uint8_t> store_bytes(const std::string& text) { return {text.begin(), text.end()}; }

}  // namespace lockstep::dist
