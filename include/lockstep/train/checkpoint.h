// Checkpoints: one safetensors file holding the model (parameters and buffers, quantizer state
// included), the optimizer state, the RNG state, the step, and the resolved configuration, so a
// checkpoint alone rebuilds the model. Written to a temporary file and renamed (G6).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace torch::nn {
class Module;
}

namespace lockstep::train {

struct Checkpoint {
  std::map<std::string, at::Tensor> model;           // parameters and buffers by module path
  std::map<std::string, at::Tensor> optimizer;       // Adam::state()
  std::map<std::string, at::Tensor> ema;             // the weights' moving average (train.ema_decay > 0), else empty
  std::map<std::string, at::Tensor> discriminator;   // loss.adversarial > 0: the discriminator, else empty
  std::map<std::string, at::Tensor> disc_optimizer;  // and its optimizer's state
  int64_t disc_optimizer_steps = 0;
  at::Tensor torch_rng;  // torch's default CPU generator state (uint8)
  int64_t step = 0;      // training steps completed
  int64_t optimizer_steps = 0;
  std::string config_toml;  // the run's resolved configuration
};

// The name of a run directory's checkpoint file.
std::string checkpoint_path(const std::string& run_dir);

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws IoError when missing and CorruptInput naming the file for a damaged or foreign file.
Checkpoint load_checkpoint(const std::string& path);

// Parameters and buffers of `module`, by path.
std::map<std::string, at::Tensor> module_state(const torch::nn::Module& module);
// Copies `state` into `module`; every tensor must be present with the same shape and dtype, and
// nothing extra. Errors name `origin` and the tensor.
void load_module_state(torch::nn::Module& module, const std::map<std::string, at::Tensor>& state,
                       const std::string& origin);

}  // namespace lockstep::train
