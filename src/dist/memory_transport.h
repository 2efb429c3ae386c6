// Ranks as threads of one process, joined in memory: no ports, no sockets, no backend. The world
// pairs each rank's k-th operation with every other rank's k-th, as a network backend would, and
// the last rank to arrive computes the result. Internal to src/dist.
#pragma once

#include <memory>

#include "transport.h"

namespace lockstep::dist {

// One transport per rank, all sharing one world. Ranks must call from different threads.
std::vector<std::unique_ptr<Transport>> make_memory_transports(int size);

}  // namespace lockstep::dist
