#include "lockstep/train/device.h"

#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>

#include "lockstep/core/error.h"
#include "lockstep/dist/backends.h"

namespace lockstep::train {

std::string DeviceSpec::to_string() const {
  if (!cuda) return "cpu";
  return index < 0 ? "cuda" : "cuda:" + std::to_string(index);
}

DeviceSpec parse_device_spec(const std::string& text, const std::string& setting) {
  DeviceSpec spec;
  if (text == "cpu") return spec;
  spec.cuda = true;
  if (text == "cuda") return spec;
  const std::string prefix = "cuda:";
  const std::string digits = text.rfind(prefix, 0) == 0 ? text.substr(prefix.size()) : std::string();
  const bool number = !digits.empty() && digits.size() <= 4 && (digits == "0" || digits[0] != '0') &&
                      digits.find_first_not_of("0123456789") == std::string::npos;
  LOCKSTEP_CHECK_ARG(number, setting, " = '", text, "' is not a device: use cpu, cuda (under a launcher, the ",
                     "rank's LOCAL_RANK'th GPU) or cuda:N");
  spec.index = std::stoi(digits);
  return spec;
}

int cuda_index_for(const DeviceSpec& spec, int local_rank, int cuda_devices, const std::string& unavailable,
                   const std::string& setting) {
  if (!spec.cuda) return -1;
  LOCKSTEP_CHECK_ARG(cuda_devices > 0, setting, " = ", spec.to_string(), ", but ", unavailable, "; use the CPU (",
                     setting, " = cpu)");
  const int index = spec.index >= 0 ? spec.index : std::max(local_rank, 0);
  if (spec.index < 0 && local_rank >= 0) {
    LOCKSTEP_CHECK_ARG(index < cuda_devices, setting, " = cuda gives each rank of a node its own GPU, but LOCAL_RANK ",
                       local_rank, " has none: this process sees ", cuda_devices, " CUDA device(s); start at most ",
                       cuda_devices, " ranks per node");
  }
  LOCKSTEP_CHECK_ARG(index < cuda_devices, setting, " = ", spec.to_string(), ", but this process sees ", cuda_devices,
                     " CUDA device(s): cuda:0 to cuda:", cuda_devices - 1);
  return index;
}

int cuda_index_for(const DeviceSpec& spec, const std::string& setting) {
  if (!spec.cuda) return -1;
  int local_rank = -1;
  if (const char* v = std::getenv("LOCAL_RANK"); v && *v) {
    char* end = nullptr;
    const long parsed = std::strtol(v, &end, 10);
    LOCKSTEP_CHECK_ARG(*end == '\0' && parsed >= 0 && parsed < (1 << 20), "environment variable LOCAL_RANK='", v,
                       "' is not a rank");
    local_rank = static_cast<int>(parsed);
  }
  const dist::BackendReport backends = dist::report_backends();
  std::string unavailable;
  if (!backends.cuda_built) {
    unavailable = "this lockstep was built without CUDA (LibTorch " + backends.libtorch_version + ", " +
                  backends.libtorch_origin + "; build against a CUDA LibTorch, see docs/devices.md)";
  } else if (backends.devices.empty()) {
    unavailable = backends.device_note.empty() ? "this process sees no CUDA device" : backends.device_note;
  }
  return cuda_index_for(spec, local_rank, static_cast<int>(backends.devices.size()), unavailable, setting);
}

}  // namespace lockstep::train
