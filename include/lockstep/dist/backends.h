// What this build of lockstep and this machine offer for distributed training and devices, as
// facts for `lockstep doctor` and for error messages: which transports were compiled in, the CUDA
// that LibTorch was built with, and the devices the driver shows now.
#pragma once

#include <string>
#include <vector>

namespace lockstep::dist {

struct BackendReport {
  std::string libtorch_version;      // "2.15.0", from the headers lockstep was compiled with
  std::string libtorch_origin;       // where the linked LibTorch lives ("system" or the wheel's directory)
  bool gloo = false;                 // Gloo transport compiled in
  bool cuda_built = false;           // CUDA paths compiled in (a CUDA LibTorch and LOCKSTEP_WITH_CUDA)
  std::string cuda_version;          // the CUDA toolkit lockstep was compiled against, "" without CUDA
  bool nccl_built = false;           // NCCL transport compiled in
  std::string nccl_version;          // of the NCCL library loaded now ("2.30.7"), "" without NCCL
  std::vector<std::string> devices;  // "cuda:0 NVIDIA H100 80GB HBM3 (79.1 GiB, compute 9.0)"
  std::string device_note;           // why `devices` is empty when CUDA is built ("no CUDA device visible")
};

// Never throws: what cannot be found out is said in the fields.
BackendReport report_backends();

}  // namespace lockstep::dist
