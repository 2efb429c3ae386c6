#include "checkpointing.h"

#include <torch/torch.h>

#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/train/run_dir.h"

namespace lockstep::train {

Checkpoint capture_checkpoint(const TrainedModules& modules, int64_t step, const Config& config) {
  Checkpoint c;
  c.model = module_state(*modules.model);
  c.optimizer = modules.adam->state();
  if (modules.ema_model) c.ema = module_state(*modules.ema_model);
  if (modules.adversary) {
    c.discriminator = module_state(modules.adversary->discriminator());
    c.disc_optimizer = modules.adversary->optimizer().state();
    c.disc_optimizer_steps = modules.adversary->optimizer().steps();
  }
  c.torch_rng = at::detail::getDefaultCPUGenerator().get_state();
  c.step = step;
  c.optimizer_steps = modules.adam->steps();
  c.config_toml = config.to_toml();
  return c;
}

void restore_checkpoint(TrainedModules& modules, const Checkpoint& c, const std::string& path,
                        const RunSettings& settings) {
  load_module_state(*modules.model, c.model, path);
  LOCKSTEP_THROW_IF_NOT(c.ema.empty() == !modules.ema_model, CorruptInput, path, ": ",
                        c.ema.empty() ? "holds no weight average" : "holds a weight average",
                        ", but its run has train.ema_decay = ", settings.train.ema_decay());
  if (modules.ema_model) load_module_state(*modules.ema_model, c.ema, path + " (weight average)");
  LOCKSTEP_THROW_IF_NOT(c.discriminator.empty() == !modules.adversary, CorruptInput, path, ": ",
                        c.discriminator.empty() ? "holds no discriminator" : "holds a discriminator",
                        ", but its run has loss.adversarial = ", settings.loss.adversarial());
  if (modules.adversary) {
    load_module_state(modules.adversary->discriminator(), c.discriminator, path + " (discriminator)");
    modules.adversary->optimizer().load_state(c.disc_optimizer, c.disc_optimizer_steps);
  }
  modules.adam->load_state(c.optimizer, c.optimizer_steps);
  LOCKSTEP_THROW_IF_NOT(c.torch_rng.defined(), CorruptInput, path, ": checkpoint has no RNG state");
  at::Generator cpu_generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor expected_rng = cpu_generator.get_state();
  LOCKSTEP_THROW_IF_NOT(
      c.torch_rng.scalar_type() == expected_rng.scalar_type() && c.torch_rng.sizes() == expected_rng.sizes(),
      CorruptInput, path, ": its RNG state is ", c.torch_rng.scalar_type(), " ", c.torch_rng.sizes(),
      ", a CPU generator's state is ", expected_rng.scalar_type(), " ", expected_rng.sizes());
  try {
    cpu_generator.set_state(c.torch_rng);
  } catch (const c10::Error& e) {
    throw CorruptInput(
        detail::concat(path, ": its RNG state is not a valid generator state: ", e.what_without_backtrace()));
  }
}

void check_resumed_config(const Config& resumed, const Config& saved, const std::string& run_dir,
                          const std::string& checkpoint) {
  // Every run writes every key to config.toml: one the file does not set (it was cut short, or
  // edited) and no override gives would silently take its default, so it must be the checkpoint's.
  std::vector<std::string> lost;
  for (const auto& spec : resumed.schema().keys()) {
    if (resumed.is_default(spec.key) && !saved.is_default(spec.key) && saved.get(spec.key) != resumed.get(spec.key)) {
      lost.push_back(spec.key + " = " + format_value(saved.get(spec.key)));
    }
  }
  const size_t lost_count = lost.size();
  if (lost.size() > 6) lost.resize(6);
  LOCKSTEP_THROW_IF_NOT(lost_count == 0, CorruptInput, "cannot resume ", run_dir, ": ", config_path(run_dir),
                        " does not set ", lost_count, " key(s) that the checkpoint's configuration sets (",
                        detail::concat_list(lost), lost_count > lost.size() ? ", ..." : "",
                        "); the file was cut short or edited: restore it");
  // Keys that shape the model or the data order must still agree with the checkpoint's.
  for (const auto& spec : resumed.schema().keys()) {
    LOCKSTEP_THROW_IF_NOT(spec.resumable || saved.get(spec.key) == resumed.get(spec.key), CorruptInput,
                          "cannot resume ", run_dir, ": '", spec.key, "' is ", format_value(resumed.get(spec.key)),
                          " in ", config_path(run_dir), " but ", format_value(saved.get(spec.key)),
                          " in the checkpoint (", checkpoint, ")");
  }
}

}  // namespace lockstep::train
