#include "rendezvous.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <thread>

#include "lockstep/dist/collective.h"

namespace lockstep::dist {
namespace {

std::string world_key(int rank) { return detail::concat("lockstep/world/", rank); }

}  // namespace

c10::intrusive_ptr<c10d::Store> rendezvous(GroupOptions& options) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(options.master_port);
  o.isServer = options.rank == 0 && !options.store_hosted;
  o.numWorkers = options.size;
  o.waitWorkers = false;
  o.timeout = options.connect_timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.master_addr, o);
    if (o.isServer) options.master_port = tcp->getPort();  // the kernel's choice when 0 was asked for
    store = tcp;
    if (!options.store_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(options.store_prefix, store);
  } catch (const std::exception& e) {
    throw CollectiveFailure(detail::concat(
        "rank ", options.rank, " of ", options.size, ": cannot reach the master's store at ", options.master_addr, ":",
        options.master_port, " within ", options.connect_timeout.count(), " ms: ", e.what()));
  }
  if (o.isServer && options.on_listening) options.on_listening(options.master_port);

  const int64_t claims = store->add(detail::concat("lockstep/claim/", options.rank), 1);
  store->set(world_key(options.rank), store_bytes(std::to_string(options.size)));
  LOCKSTEP_THROW_IF_NOT(claims == 1, CollectiveFailure, "rank ", options.rank, " of ", options.size,
                        ": another process already joined as rank ", options.rank,
                        " (check RANK / --node-rank on every process)");
  // Polled with check() rather than a blocking wait, so that the ranks missing at the deadline
  // can be named (TCPStore's own timeout names no key).
  const auto deadline = std::chrono::steady_clock::now() + options.connect_timeout;
  std::vector<std::string> missing;
  while (true) {
    missing.clear();
    for (int r = 0; r < options.size; ++r) {
      if (!store->check({world_key(r)})) missing.push_back(std::to_string(r));
    }
    if (missing.empty() || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  LOCKSTEP_THROW_IF_NOT(missing.empty(), CollectiveFailure, "rank ", options.rank, " of ", options.size, ": rank(s) ",
                        detail::concat_list(missing), " did not arrive at ", options.master_addr, ":",
                        options.master_port, " within ", options.connect_timeout.count(), " ms");
  for (int r = 0; r < options.size; ++r) {
    const auto v = store->get(world_key(r));
    const std::string theirs(v.begin(), v.end());
    LOCKSTEP_THROW_IF_NOT(theirs == std::to_string(options.size), CollectiveFailure, "rank ", options.rank,
                          " has WORLD_SIZE ", options.size, " but rank ", r, " has WORLD_SIZE ", theirs);
  }
  return store;
}

}  // namespace lockstep::dist
