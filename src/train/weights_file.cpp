#include "lockstep/train/weights_file.h"

#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/tensor_convert.h"

namespace lockstep::train {

void require_weights_file(const std::string& path, const std::string& key, const std::string& what) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  LOCKSTEP_THROW_IF_NOT(std::filesystem::exists(status), IoError, key, " = ", path, ": no such file. ", what);
  LOCKSTEP_THROW_IF_NOT(!std::filesystem::is_directory(status), IoError, key, " = ", path,
                        ": is a directory, not a weights file. ", what);
  LOCKSTEP_THROW_IF_NOT(std::filesystem::is_regular_file(status), IoError, key, " = ", path,
                        ": is not a regular file (a FIFO, socket or device). ", what);
}

std::map<std::string, at::Tensor> read_weights_file(const std::string& path, const std::string& key,
                                                    const std::string& what) {
  require_weights_file(path, key, what);
  std::map<std::string, at::Tensor> weights;
  for (const auto& [name, raw] : io::load_safetensors(path).tensors) {
    at::Tensor tensor = io::from_raw(raw);
    // Network weights are real numbers: integers would be converted silently, and mean another file.
    // BatchNorm's step counters are the one integer entry a state dict holds.
    const bool counter = name.size() >= 19 && name.compare(name.size() - 19, 19, "num_batches_tracked") == 0;
    LOCKSTEP_THROW_IF_NOT(tensor.is_floating_point() || counter, CorruptInput, key, " = ", path, ": tensor '", name,
                          "' holds ", tensor.scalar_type(), ", not floating-point values. ", what);
    weights[name] = std::move(tensor);
  }
  return weights;
}

}  // namespace lockstep::train
