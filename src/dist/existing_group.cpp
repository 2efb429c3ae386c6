#include "lockstep/dist/existing_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "c10d_transport.h"
#include "checked_group.h"
#include "lockstep/core/error.h"
#include "network_transports.h"

namespace lockstep::dist {

std::shared_ptr<Group> make_group_over(c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                                       c10::intrusive_ptr<c10d::Store> store, const ExistingGroupOptions& options) {
  LOCKSTEP_CHECK_ARG(process_group && store, "make_group_over: no process group or no store given");
#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<C10dBackend> backend;
  try {
    backend = process_group->getBackend(c10d::ProcessGroup::BackendType::GLOO);
  } catch (const c10::Error&) {
    throw InvalidArgument(detail::concat("rank ", process_group->getRank(), ": the process group has no Gloo backend, ",
                                         "which lockstep's checked channel needs for its fingerprints ",
                                         "(init_process_group(\"cpu:gloo,cuda:nccl\") gives both)"));
  }
#else
  c10::intrusive_ptr<C10dBackend> backend = process_group;
#endif
  CheckedGroupOptions c;
  c.rank = process_group->getRank();
  c.size = process_group->getSize();
  c.timeout = options.timeout;
  c.store_grace = std::chrono::milliseconds(0);  // the store is the caller's, and outlives this group
  c.where = detail::concat("gloo (the caller's process group), rank ", c.rank, " of ", c.size);
  auto transport =
      std::make_unique<C10dTransport>(backend, "gloo", c10::Device(c10::kCPU), backstop_timeout(options.timeout));
  return std::make_shared<CheckedGroup>(c, c10::make_intrusive<c10d::PrefixStore>(options.prefix, store),
                                        std::move(transport));
}

}  // namespace lockstep::dist
