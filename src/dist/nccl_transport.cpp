// NCCL carries CUDA tensors between processes. Fingerprints never travel on it: the checked channel
// exchanges them on Gloo (CPU, TCP) first, so ranks that disagree about a call raise
// CollectiveMismatch before any NCCL call is issued (NCCL itself would hang on a mismatch). A dead
// or stalled peer is seen through the store's heartbeats while the host polls the GPU work without
// blocking; abandon() then aborts the communicator, which frees the streams waiting on that peer.
#include "lockstep/config_build.h"
#include "lockstep/dist/collective.h"
#include "network_transports.h"

#if LOCKSTEP_HAVE_NCCL
#ifndef USE_C10D_NCCL  // LibTorch 2.x's CMake target defines it already
#define USE_C10D_NCCL
#endif
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "c10d_transport.h"
#endif

namespace lockstep::dist {

#if LOCKSTEP_HAVE_NCCL
std::unique_ptr<Transport> make_nccl_transport(const c10::intrusive_ptr<c10d::Store>& store,
                                               const GroupOptions& options) {
  const int devices = static_cast<int>(torch::cuda::device_count());
  LOCKSTEP_CHECK_ARG(options.cuda_device >= 0 && options.cuda_device < devices, "rank ", options.rank, " of ",
                     options.size, ": CUDA device ", options.cuda_device, " does not exist (", devices, " visible)");
  const auto backstop = backstop_timeout(options.timeout);
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = backstop;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store),
                                                          options.rank, options.size, nccl_options);
  // One communicator, on this rank's device, made by the first collective.
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(options.cuda_device));
  nccl->setBoundDeviceId(device);
  auto abort = [nccl] { nccl->abort(); };
  return std::make_unique<C10dTransport>(nccl, "nccl", device, backstop, abort);
}
#else
std::unique_ptr<Transport> make_nccl_transport(const c10::intrusive_ptr<c10d::Store>&, const GroupOptions& options) {
  throw InvalidArgument(detail::concat("rank ", options.rank, " of ", options.size, ": CUDA device ",
                                       options.cuda_device, " asked for, but this build of lockstep has no NCCL ",
                                       "(it needs a LibTorch built with CUDA: make LIBTORCH=pip)"));
}
#endif

}  // namespace lockstep::dist
