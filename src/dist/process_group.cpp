#include "lockstep/dist/process_group.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
#include <optional>

#include "checked_group.h"
#include "lockstep/dist/collective.h"
#include "memory_transport.h"
#include "network_transports.h"
#include "rendezvous.h"

namespace lockstep::dist {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int fallback) {
  const auto v = env(name);
  if (!v) return fallback;
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LOCKSTEP_CHECK_ARG(used == v->size() && !v->empty(), "environment variable ", name, "='", *v, "' is not an integer");
  return value;
}

}  // namespace

bool GroupOptions::environment_has_ranks() { return env("WORLD_SIZE").has_value() || env("RANK").has_value(); }

GroupOptions GroupOptions::from_environment() {
  GroupOptions o;
  o.size = env_int("WORLD_SIZE", 1);
  o.rank = env_int("RANK", 0);
  o.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
  o.master_port = env_int("MASTER_PORT", 29500);
  // torchrun >= 2.4 hosts the store in its agent and restarts workers on the same one.
  o.store_hosted = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (o.store_hosted) {
    o.store_prefix = detail::concat("lockstep/", env("TORCHELASTIC_RUN_ID").value_or("run"), "/",
                                    env("TORCHELASTIC_RESTART_COUNT").value_or("0"), "/");
  }
  LOCKSTEP_CHECK_ARG(o.size >= 1, "environment variable WORLD_SIZE=", o.size, " must be >= 1");
  LOCKSTEP_CHECK_ARG(o.rank >= 0 && o.rank < o.size, "environment variable RANK=", o.rank,
                     " must lie in [0, WORLD_SIZE=", o.size, ")");
  const int local_size = env_int("LOCAL_WORLD_SIZE", -1);
  const int local_rank = env_int("LOCAL_RANK", -1);
  if (local_size != -1) {
    LOCKSTEP_CHECK_ARG(local_size >= 1 && local_size <= o.size, "environment variable LOCAL_WORLD_SIZE=", local_size,
                       " must lie in [1, WORLD_SIZE=", o.size, "]");
  }
  if (local_rank != -1) {
    const int bound = local_size != -1 ? local_size : o.size;
    LOCKSTEP_CHECK_ARG(local_rank >= 0 && local_rank < bound, "environment variable LOCAL_RANK=", local_rank,
                       " must lie in [0, ", local_size != -1 ? "LOCAL_WORLD_SIZE=" : "WORLD_SIZE=", bound, ")");
  }
  o.validate();
  return o;
}

void GroupOptions::validate() const {
  LOCKSTEP_CHECK_ARG(size >= 1, "group size ", size, " must be >= 1");
  LOCKSTEP_CHECK_ARG(rank >= 0 && rank < size, "rank ", rank, " must lie in [0, ", size, ")");
  LOCKSTEP_CHECK_ARG(master_port >= 0 && master_port <= 65535, "master port ", master_port, " must lie in [0, 65535]");
  LOCKSTEP_CHECK_ARG(master_port != 0 || (rank == 0 && !store_hosted), "rank ", rank,
                     " needs the port of the store; port 0 (any free port) is for rank 0 alone when it hosts the "
                     "store, and then says the port it got");
  LOCKSTEP_CHECK_ARG(!master_addr.empty(), "the master address is empty");
  LOCKSTEP_CHECK_ARG(timeout.count() > 0, "collective timeout ", timeout.count(), " ms must be positive");
  LOCKSTEP_CHECK_ARG(connect_timeout >= std::chrono::seconds(1), "connect timeout ", connect_timeout.count(),
                     " ms must be at least 1000 ms (TCPStore counts whole seconds)");
}

std::shared_ptr<Group> make_process_group(const GroupOptions& options) {
  options.validate();
  GroupOptions o = options;
  const auto store = rendezvous(o);  // fills in rank 0's port when the kernel chose it
  std::unique_ptr<Transport> control = make_gloo_transport(store, o);
  std::unique_ptr<Transport> device = o.cuda_device >= 0 ? make_nccl_transport(store, o) : nullptr;
  CheckedGroupOptions c;
  c.rank = o.rank;
  c.size = o.size;
  c.timeout = o.timeout;
  c.checked = o.checked;
  c.predict = o.predict;
  c.where =
      detail::concat(control->name(), device ? detail::concat(" + ", device->name(), " on cuda:", o.cuda_device) : "",
                     ", rank ", o.rank, " of ", o.size, " via ", o.master_addr, ":", o.master_port,
                     o.store_hosted ? " (the launcher's store)" : "");
  return std::make_shared<CheckedGroup>(c, store, std::move(control), std::move(device));
}

std::vector<std::shared_ptr<Group>> make_in_memory_groups(const GroupOptions& options) {
  LOCKSTEP_CHECK_ARG(options.size >= 1, "group size ", options.size, " must be >= 1");
  LOCKSTEP_CHECK_ARG(options.timeout.count() > 0, "collective timeout ", options.timeout.count(),
                     " ms must be positive");
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<Transport>> transports = make_memory_transports(options.size);
  std::vector<std::shared_ptr<Group>> groups;
  for (int r = 0; r < options.size; ++r) {
    CheckedGroupOptions c;
    c.rank = r;
    c.size = options.size;
    c.timeout = options.timeout;
    c.checked = options.checked;
    c.predict = options.predict;
    c.store_grace = std::chrono::milliseconds(0);  // the store lives as long as any rank's group
    c.where = detail::concat("in-memory, rank ", r, " of ", options.size);
    groups.push_back(std::make_shared<CheckedGroup>(c, store, std::move(transports[r])));
  }
  return groups;
}

}  // namespace lockstep::dist
