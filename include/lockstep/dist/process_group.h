// Groups of many ranks, all behind one checked channel (G1, G2): before any data moves, the ranks
// exchange a fixed-size fingerprint of the call, and a disagreement raises CollectiveMismatch on
// every rank; a dead or stalled rank is named by every other one. Under the channel, a transport
// moves the bytes: between processes Gloo (CPU tensors) and NCCL (CUDA tensors), after ranks met
// through a TCP store at the master's address; between threads of one process, memory.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/group.h"

namespace lockstep::dist {

struct GroupOptions {
  int rank = 0;
  int size = 1;
  std::string master_addr = "127.0.0.1";
  // 0 on rank 0: any free port (the kernel's choice, so no race with other programs); the port is
  // then passed to on_listening, and the other ranks must be told it.
  int master_port = 29500;
  // The launcher hosts the store (torchrun's agent does: TORCHELASTIC_USE_AGENT_STORE=True), so rank
  // 0 connects to it as a client instead of listening on master_port itself.
  bool store_hosted = false;
  // Prepended to every key lockstep writes in the store (a hosted store outlives restarts).
  std::string store_prefix;
  // Called on rank 0 once its store listens, with the port, before waiting for the other ranks.
  std::function<void(int port)> on_listening;
  // Default limit of each collective (CollectiveOptions::timeout overrides it per call).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // How long ranks wait for each other (and rank 0's store) at start-up; TCPStore's socket code
  // counts whole seconds, so use at least 1 s.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};

  // Exchange fingerprints before every collective (G1). Off only to measure what the check costs.
  bool checked = true;
  // Once the calls repeat, check each one against what the repetition predicts, locally, with no exchange
  // (docs/distributed.md "Predicted checks"). Off: every collective exchanges its fingerprint.
  bool predict = true;

  // The CUDA device whose tensors this rank's collectives may carry (over NCCL); -1: CPU tensors
  // only (Gloo). Fingerprints always travel on Gloo.
  int cuda_device = -1;

  // torchrun's variables: RANK, WORLD_SIZE, MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default
  // 29500); LOCAL_RANK and LOCAL_WORLD_SIZE are checked when set; TORCHELASTIC_USE_AGENT_STORE,
  // TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT select torchrun's hosted store. Throws InvalidArgument naming
  // the variable and its value when one is malformed or they contradict each other.
  static GroupOptions from_environment();
  // True when WORLD_SIZE or RANK is set: the process was started as one rank of several.
  static bool environment_has_ranks();

  // Throws InvalidArgument naming the values: size < 1, rank outside [0, size), bad port (0 on a
  // rank other than 0), a
  // timeout <= 0 or a connect timeout under 1 s.
  void validate() const;
};

// Connects to the others (rank 0 hosts the store). Throws CollectiveFailure naming the ranks that
// did not arrive within connect_timeout, or the master address that could not be reached.
std::shared_ptr<Group> make_process_group(const GroupOptions& options);

// `size` ranks as threads of this process, joined in memory: no ports or sockets, the same checked
// channel (fingerprints, liveness, reports) as make_process_group. Group r is rank r; each must be
// used from its own thread, as ranks would. Only options.size, timeout, checked and predict are used.
std::vector<std::shared_ptr<Group>> make_in_memory_groups(const GroupOptions& options);

}  // namespace lockstep::dist
