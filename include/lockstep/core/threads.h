// How many intra-op threads a process should run. N ranks on one machine that each start one
// thread per core oversubscribe it: OpenMP workers spin on descheduled peers and a 2-rank run on
// 2 cores trains ~20x slower than one process. So by default the ranks of a node share its cores.
#pragma once

#include <string>

namespace lockstep {

struct ThreadChoice {
  int threads = 1;
  std::string reason;  // why, for the user: "--threads", "2 cores shared by 2 ranks on this node", ...
};

// The most intra-op threads accepted per core this process may use; more only slows it down
// (and 100,000 threads take minutes to start).
constexpr int kMaxThreadsPerCore = 4;

// requested > 0: that many (`flag` names where it came from in the reason). requested == 0: the
// positive integer in OMP_NUM_THREADS when set, else the cores this process may run on divided
// among the ranks on this node (LOCAL_WORLD_SIZE, which lockstep launch and torchrun set), at
// least 1. Throws InvalidArgument naming the value when requested < 0 or more than
// kMaxThreadsPerCore per core, or when OMP_NUM_THREADS or LOCAL_WORLD_SIZE is malformed.
ThreadChoice choose_threads(long long requested, const std::string& flag = "--threads");

// The ranks of this node from LOCAL_WORLD_SIZE (1 when unset). Throws InvalidArgument when malformed.
int local_world_size();

}  // namespace lockstep
