#include "lockstep/dist/existing_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>

#include "c10d_transport.h"
#include "checked_group.h"
#include "lockstep/core/error.h"
#include "network_transports.h"

namespace lockstep::dist {
namespace {

#if TORCH_VERSION_MAJOR >= 2
// The process group's built-in backend of `type` (Gloo, NCCL), when it has one; a backend registered
// under another name (Backend.register_backend) is not one, whatever it wraps.
c10::intrusive_ptr<C10dBackend> built_in(const c10d::ProcessGroup& group, c10d::ProcessGroup::BackendType type) {
  try {
    return group.getBackend(type);
  } catch (const c10::Error&) {  // the group has no such backend
    return {};
  }
}
#endif

}  // namespace

std::shared_ptr<Group> make_group_over(c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                                       c10::intrusive_ptr<c10d::Store> store, const ExistingGroupOptions& options) {
  LOCKSTEP_CHECK_ARG(process_group && store, "make_group_over: no process group or no store given");
  CheckedGroupOptions c;
  c.rank = process_group->getRank();
  c.size = process_group->getSize();
  c.timeout = options.timeout;
  c.name = options.name;
  c.global_ranks = options.global_ranks;
  c.predict = options.predict;
  c.store_grace = std::chrono::milliseconds(0);  // the store is the caller's, and outlives this group
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(options.prefix, store);
  const auto backstop = backstop_timeout(options.timeout);
#if TORCH_VERSION_MAJOR >= 2
  // Fingerprints and CPU tensors travel on the group's own Gloo backend when it has one (and own_gloo is
  // off); otherwise on a Gloo group of lockstep's own, made by `make_gloo` or met through the store.
  std::unique_ptr<Transport> control;
  std::string what;
  c10::intrusive_ptr<C10dBackend> gloo;
  if (!options.own_gloo) gloo = built_in(*process_group, c10d::ProcessGroup::BackendType::GLOO);
  if (gloo) {
    control = std::make_unique<C10dTransport>(gloo, "gloo", c10::Device(c10::kCPU), backstop);
    what = "gloo (the caller's process group)";
  } else if (options.make_gloo) {
    control = std::make_unique<C10dTransport>(options.make_gloo(options.prefix + "/gloo"), "gloo",
                                              c10::Device(c10::kCPU), backstop);
    what = "gloo of lockstep's own beside the caller's process group";
  } else {
    GroupOptions side;
    side.rank = c.rank;
    side.size = c.size;
    side.timeout = options.timeout;
    const char* master = std::getenv("MASTER_ADDR");
    side.master_addr = master && *master ? master : "127.0.0.1";
    control = make_gloo_transport(prefixed, side);
    what = "gloo of lockstep's own beside the caller's process group";
  }
  // CUDA tensors stay on the device: they travel on the group's NCCL backend.
  std::unique_ptr<Transport> device;
  if (auto nccl = built_in(*process_group, c10d::ProcessGroup::BackendType::NCCL)) {
    device = std::make_unique<C10dTransport>(nccl, "nccl", c10::Device(c10::kCUDA), backstop);
    what += ", CUDA tensors on its NCCL";
  }
#else
  auto control = std::make_unique<C10dTransport>(process_group, "gloo", c10::Device(c10::kCPU), backstop);
  std::unique_ptr<Transport> device;
  std::string what = "gloo (the caller's process group)";
#endif
  c.where = detail::concat(what, ", rank ", c.rank, " of ", c.size);
  return std::make_shared<CheckedGroup>(c, prefixed, std::move(control), std::move(device));
}

}  // namespace lockstep::dist
