#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>
#include <future>
#include <thread>

#include "lockstep/config_build.h"
#include "lockstep/dist/collective.h"
#include "network_transports.h"
#if LOCKSTEP_HAVE_GLOO
#include "c10d_transport.h"
#include "gloo_headers.h"
#endif

namespace lockstep::dist {

#if LOCKSTEP_HAVE_GLOO
namespace {

// GLOO_SOCKET_IFNAME as in PyTorch; else loopback masters keep every rank on 127.0.0.1, and
// otherwise Gloo binds to this host's address.
std::shared_ptr<::gloo::transport::Device> gloo_device(const GroupOptions& options) {
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  if (interface && *interface) return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  const std::string& m = options.master_addr;
  if (m == "127.0.0.1" || m == "localhost") return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

// Connecting every pair runs on a helper thread that is abandoned when it takes longer than
// connect_timeout (Gloo's own connect waits for its whole backstop): the process reports and exits.
std::unique_ptr<Transport> make_gloo_transport(const c10::intrusive_ptr<c10d::Store>& store,
                                               const GroupOptions& options) {
  const auto backstop = backstop_timeout(options.timeout);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(backstop);
  gloo_options->devices.push_back(gloo_device(options));
  using Gloo = c10::intrusive_ptr<c10d::ProcessGroupGloo>;
  auto made = std::make_shared<std::promise<Gloo>>();
  std::future<Gloo> result = made->get_future();
  std::thread([made, prefixed = c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank = options.rank,
               size = options.size, gloo_options] {
    try {
      made->set_value(c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, gloo_options));
    } catch (...) {
      made->set_exception(std::current_exception());
    }
  }).detach();
  LOCKSTEP_THROW_IF_NOT(result.wait_for(options.connect_timeout) == std::future_status::ready, CollectiveFailure,
                        "rank ", options.rank, " of ", options.size, ": Gloo could not connect to every other ",
                        "rank within ", options.connect_timeout.count(),
                        " ms (did a rank die while connecting, or does a firewall block the ports?)");
  return std::make_unique<C10dTransport>(result.get(), "gloo", c10::Device(c10::kCPU), backstop);
}
#else
std::unique_ptr<Transport> make_gloo_transport(const c10::intrusive_ptr<c10d::Store>&, const GroupOptions& options) {
  throw InvalidArgument(detail::concat("rank ", options.rank, " of ", options.size, ": this build of lockstep has no ",
                                       "Gloo (its headers were not found at configure time: install libgloo-dev)"));
}
#endif

}  // namespace lockstep::dist
