#include "lockstep/train/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/io/tensor_convert.h"

namespace lockstep::train {
namespace {
constexpr const char* kFormat = "lockstep-checkpoint-1";
constexpr const char* kModelPrefix = "model/";
constexpr const char* kOptimizerPrefix = "optim/";
constexpr const char* kEmaPrefix = "ema/";
constexpr const char* kDiscPrefix = "disc/";
constexpr const char* kDiscOptimizerPrefix = "disc_optim/";
constexpr const char* kRngKey = "rng/torch_cpu";

int64_t parse_int(const io::SafetensorsData& data, const std::string& key) {
  auto it = data.metadata.find(key);
  LOCKSTEP_THROW_IF_NOT(it != data.metadata.end(), CorruptInput, data.origin, ": checkpoint metadata has no '", key,
                        "'");
  // Digits only: stoll would also take " 10" or "+10", which lockstep never writes.
  const bool digits = !it->second.empty() &&
                      std::all_of(it->second.begin(), it->second.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits && it->second.size() <= 18) return std::stoll(it->second);
  throw CorruptInput(detail::concat(
      data.origin, ": checkpoint metadata '", key, "' = '", it->second, "' is ",
      digits ? "too large: lockstep writes at most 18 digits (below 10^18)" : "not a non-negative integer"));
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
}  // namespace

std::string checkpoint_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "checkpoint.safetensors").string();
}

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  io::SafetensorsData data;
  for (const auto& [name, t] : c.model) data.tensors[kModelPrefix + name] = io::to_raw(t);
  for (const auto& [name, t] : c.optimizer) data.tensors[kOptimizerPrefix + name] = io::to_raw(t);
  for (const auto& [name, t] : c.ema) data.tensors[kEmaPrefix + name] = io::to_raw(t);
  for (const auto& [name, t] : c.discriminator) data.tensors[kDiscPrefix + name] = io::to_raw(t);
  for (const auto& [name, t] : c.disc_optimizer) data.tensors[kDiscOptimizerPrefix + name] = io::to_raw(t);
  if (c.torch_rng.defined()) data.tensors[kRngKey] = io::to_raw(c.torch_rng);
  data.metadata = {{"format", kFormat},
                   {"lockstep_version", LOCKSTEP_VERSION},
                   {"step", std::to_string(c.step)},
                   {"optimizer_steps", std::to_string(c.optimizer_steps)},
                   {"config", c.config_toml}};
  if (!c.discriminator.empty()) data.metadata["disc_optimizer_steps"] = std::to_string(c.disc_optimizer_steps);
  io::save_safetensors(path, data);
}

Checkpoint load_checkpoint(const std::string& path) {
  const io::SafetensorsData data = io::load_safetensors(path);
  auto format = data.metadata.find("format");
  LOCKSTEP_THROW_IF_NOT(format != data.metadata.end() && format->second == kFormat, CorruptInput, path,
                        ": not a lockstep checkpoint (metadata 'format' is '",
                        format == data.metadata.end() ? "<missing>" : format->second, "', expected '", kFormat, "')");
  Checkpoint c;
  c.step = parse_int(data, "step");
  c.optimizer_steps = parse_int(data, "optimizer_steps");
  // Checked here, before a model is built: Adam's bias correction needs the count exact as a double.
  for (const auto& [key, count] : {std::pair{"step", c.step}, std::pair{"optimizer_steps", c.optimizer_steps}}) {
    LOCKSTEP_THROW_IF_NOT(count < (int64_t{1} << 53), CorruptInput, path, ": checkpoint metadata '", key, "' = ", count,
                          " is not below 2^53, the most steps a run can count exactly");
  }
  auto config = data.metadata.find("config");
  LOCKSTEP_THROW_IF_NOT(config != data.metadata.end(), CorruptInput, path, ": checkpoint metadata has no 'config'");
  c.config_toml = config->second;
  for (const auto& [name, raw] : data.tensors) {
    if (starts_with(name, kModelPrefix)) {
      c.model[name.substr(std::strlen(kModelPrefix))] = io::from_raw(raw);
    } else if (starts_with(name, kOptimizerPrefix)) {
      c.optimizer[name.substr(std::strlen(kOptimizerPrefix))] = io::from_raw(raw);
    } else if (starts_with(name, kEmaPrefix)) {
      c.ema[name.substr(std::strlen(kEmaPrefix))] = io::from_raw(raw);
    } else if (starts_with(name, kDiscPrefix)) {
      c.discriminator[name.substr(std::strlen(kDiscPrefix))] = io::from_raw(raw);
    } else if (starts_with(name, kDiscOptimizerPrefix)) {
      c.disc_optimizer[name.substr(std::strlen(kDiscOptimizerPrefix))] = io::from_raw(raw);
    } else if (name == kRngKey) {
      c.torch_rng = io::from_raw(raw);
    } else {
      throw CorruptInput(detail::concat(path, ": unexpected tensor '", name, "' in a lockstep checkpoint"));
    }
  }
  LOCKSTEP_THROW_IF_NOT(!c.model.empty(), CorruptInput, path, ": checkpoint holds no model tensors");
  if (!c.discriminator.empty()) c.disc_optimizer_steps = parse_int(data, "disc_optimizer_steps");
  return c;
}

std::map<std::string, at::Tensor> module_state(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> state;
  for (const auto& p : module.named_parameters(true)) state[p.key()] = p.value();
  for (const auto& b : module.named_buffers(true)) state[b.key()] = b.value();
  return state;
}

void load_module_state(torch::nn::Module& module, const std::map<std::string, at::Tensor>& state,
                       const std::string& origin) {
  torch::NoGradGuard no_grad;
  const auto own = module_state(module);
  for (const auto& [name, src] : state) {
    LOCKSTEP_THROW_IF_NOT(own.count(name), CorruptInput, origin, ": tensor '", name,
                          "' does not belong to this model (was it written with another configuration?)");
  }
  for (const auto& [name, dst] : own) {
    auto it = state.find(name);
    LOCKSTEP_THROW_IF_NOT(it != state.end(), CorruptInput, origin, ": no tensor '", name, "' for the model");
    LOCKSTEP_THROW_IF_NOT(it->second.sizes() == dst.sizes() && it->second.scalar_type() == dst.scalar_type(),
                          CorruptInput, origin, ": tensor '", name, "' is ", it->second.scalar_type(), " ",
                          it->second.sizes(), ", the model needs ", dst.scalar_type(), " ", dst.sizes());
    // A nan or inf weight turns every later result into garbage (token ids of -2^31): refused here.
    LOCKSTEP_THROW_IF_NOT(!it->second.is_floating_point() || torch::isfinite(it->second).all().item<bool>(),
                          CorruptInput, origin, ": tensor '", name, "' holds nan or infinite values");
    at::Tensor(dst).copy_(it->second);
  }
}

}  // namespace lockstep::train
