#include "lockstep/train/lpips_weights.h"

#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/tensor_convert.h"

namespace lockstep::train {

model::Lpips load_lpips(const std::string& path, const std::string& key) {
  LOCKSTEP_THROW_IF_NOT(std::filesystem::is_regular_file(path), IoError, key, " = ", path,
                        ": no such file. LPIPS needs the VGG16 and LPIPS weights as one safetensors file; "
                        "docs/losses.md shows how to write it from the lpips package");
  const io::SafetensorsData data = io::load_safetensors(path);
  std::map<std::string, at::Tensor> weights;
  for (const auto& [name, raw] : data.tensors) weights[name] = io::from_raw(raw);
  return model::Lpips(weights, key + " = " + path);
}

}  // namespace lockstep::train
