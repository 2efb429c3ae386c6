// Network weights the user supplies as a safetensors file (LPIPS's VGG16, FID's Inception).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace lockstep::train {

// The file's tensors by name. Throws IoError "KEY = PATH: no such file. WHAT" when it is missing (or
// names it a directory or not a regular file), and CorruptInput when it is not a safetensors file
// or a tensor in it is not floating-point (for every network: LPIPS's and FID's alike).
std::map<std::string, at::Tensor> read_weights_file(const std::string& path, const std::string& key,
                                                    const std::string& what);
// Only the IoErrors above, for a rank that checks the file is there without reading it.
void require_weights_file(const std::string& path, const std::string& key, const std::string& what);

}  // namespace lockstep::train
