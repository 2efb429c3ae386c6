// LPIPS-VGG weights for tests (no download): random, in the layout, and as a file.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>

#include "lockstep/io/safetensors.h"
#include "lockstep/io/tensor_convert.h"
#include "lockstep/model/lpips.h"

namespace lockstep::test_util {

// He-scaled convolutions, so features neither vanish nor explode, and non-negative heads, as
// trained LPIPS heads are. Drawn from a generator of their own: torch's default one is untouched.
inline std::map<std::string, at::Tensor> random_lpips_weights(uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::map<std::string, at::Tensor> w;
  for (const auto& [name, shape] : model::LpipsImpl::required_tensors()) {
    at::Tensor t = at::randn(shape, generator);
    if (shape.size() == 4 && shape[0] > 1) t *= std::sqrt(2.0 / static_cast<double>(shape[1] * 9));
    if (shape.size() == 1) t *= 0.01;
    if (shape.size() == 4 && shape[0] == 1) t = t.abs();
    w[name] = t;
  }
  return w;
}

inline void write_random_lpips_weights(const std::string& path, uint64_t seed) {
  io::SafetensorsData data;
  for (const auto& [name, t] : random_lpips_weights(seed)) data.tensors[name] = io::to_raw(t);
  io::save_safetensors(path, data);
}

}  // namespace lockstep::test_util
