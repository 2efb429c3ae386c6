#include "lockstep/dist/backends.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdio>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#if LOCKSTEP_HAVE_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <cuda.h>
#endif
#if LOCKSTEP_HAVE_NCCL
#include <nccl.h>
#endif

namespace lockstep::dist {

BackendReport report_backends() {
  BackendReport r;
  r.libtorch_version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                       std::to_string(TORCH_VERSION_PATCH);
  r.libtorch_origin = *LOCKSTEP_TORCH_ROOT ? LOCKSTEP_TORCH_ROOT : "system";
  r.gloo = LOCKSTEP_HAVE_GLOO;
#if LOCKSTEP_HAVE_CUDA
  r.cuda_built = true;
  r.cuda_version = std::to_string(CUDA_VERSION / 1000) + "." + std::to_string(CUDA_VERSION % 1000 / 10);
  try {
    const int count = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    for (int d = 0; d < count; ++d) {
      const cudaDeviceProp* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(d));
      char size[32];
      std::snprintf(size, sizeof size, "%.1f", static_cast<double>(p->totalGlobalMem) / (1024.0 * 1024 * 1024));
      r.devices.push_back(
          detail::concat("cuda:", d, " ", p->name, " (", size, " GiB, compute ", p->major, ".", p->minor, ")"));
    }
    if (count == 0) r.device_note = "no CUDA device visible (no GPU, or no driver)";
  } catch (const std::exception& e) {
    r.device_note = std::string("the CUDA runtime failed: ") + e.what();
  }
#endif
#if LOCKSTEP_HAVE_NCCL
  r.nccl_built = true;
  int version = 0;
  if (ncclGetVersion(&version) == ncclSuccess) {
    // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
    r.nccl_version = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
                     std::to_string(version % 100);
  }
#endif
  return r;
}

}  // namespace lockstep::dist
