// Where a rank trains (train.device): "cpu", "cuda" or "cuda:N". Under a launcher (LOCAL_RANK set)
// "cuda" means the LOCAL_RANK'th visible device, so each rank of a node takes its own GPU.
#pragma once

#include <string>

namespace lockstep::train {

struct DeviceSpec {
  bool cuda = false;
  int index = -1;  // cuda:N; -1 for "cuda" (the launcher's LOCAL_RANK, else 0)

  std::string to_string() const;  // as written: "cpu", "cuda", "cuda:1"
};

// Throws InvalidArgument naming the text unless it is "cpu", "cuda" or "cuda:N" (N a small
// non-negative integer without sign or leading zeros). `setting`: what the errors call it.
DeviceSpec parse_device_spec(const std::string& text, const std::string& setting = "train.device");

// The CUDA device index a rank uses, or -1 for the CPU. local_rank: LOCAL_RANK, -1 outside a
// launcher; cuda_devices: how many devices this process sees; unavailable: why there are none
// (said in the error). Throws InvalidArgument when CUDA is asked for and the device is not there.
int cuda_index_for(const DeviceSpec& spec, int local_rank, int cuda_devices, const std::string& unavailable,
                   const std::string& setting = "train.device");

// The same for this process: LOCAL_RANK from the environment, the devices from LibTorch.
int cuda_index_for(const DeviceSpec& spec, const std::string& setting = "train.device");

}  // namespace lockstep::train
