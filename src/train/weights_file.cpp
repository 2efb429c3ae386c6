#include "lockstep/train/weights_file.h"

#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/tensor_convert.h"

namespace lockstep::train {

void require_weights_file(const std::string& path, const std::string& key, const std::string& what) {
  LOCKSTEP_THROW_IF_NOT(std::filesystem::is_regular_file(path), IoError, key, " = ", path, ": no such file. ", what);
}

std::map<std::string, at::Tensor> read_weights_file(const std::string& path, const std::string& key,
                                                    const std::string& what) {
  require_weights_file(path, key, what);
  std::map<std::string, at::Tensor> weights;
  for (const auto& [name, raw] : io::load_safetensors(path).tensors) weights[name] = io::from_raw(raw);
  return weights;
}

}  // namespace lockstep::train
