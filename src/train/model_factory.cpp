#include "lockstep/train/model_factory.h"

namespace lockstep::train {

quant::OptionReader quantizer_options(const Config& config, const std::string& name) {
  const std::string prefix = "quantizer." + name + ".";
  const Config* c = &config;
  quant::OptionReader r;
  r.integer = [c, prefix](const std::string& key) { return c->get_int(prefix + key); };
  r.real = [c, prefix](const std::string& key) { return c->get_float(prefix + key); };
  r.boolean = [c, prefix](const std::string& key) { return c->get_bool(prefix + key); };
  r.string = [c, prefix](const std::string& key) { return c->get_string(prefix + key); };
  r.int_list = [c, prefix](const std::string& key) { return c->get_int_list(prefix + key); };
  r.float_list = [c, prefix](const std::string& key) { return c->get_float_list(prefix + key); };
  r.section = [c](const std::string& section) { return quantizer_options(*c, section); };
  return r;
}

model::Autoencoder build_model(const RunSettings& settings, const Config& config, int64_t in_channels) {
  const std::string& name = settings.quantizer.name();
  auto quantizer = quant::make_quantizer(name, quantizer_options(config, name));
  const ModelSettings& m = settings.model;
  model::AutoencoderOptions options(in_channels, m.channels());
  options.architecture(model::parse_architecture(m.architecture()))
      .res_blocks(m.res_blocks())
      .batch_norm(m.batch_norm())
      .attention_levels(m.attention_levels())
      .mid_attention(m.mid_attention())
      .norm_groups(m.norm_groups());
  return model::Autoencoder(options, quantizer);
}

}  // namespace lockstep::train

#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/train/checkpoint.h"

namespace lockstep::train {

TrainedModel load_trained_model(const std::string& checkpoint_or_run_dir, bool weight_average) {
  namespace fs = std::filesystem;
  std::string path = checkpoint_or_run_dir;
  if (fs::is_directory(path)) path = checkpoint_path(path);
  LOCKSTEP_THROW_IF_NOT(fs::is_regular_file(path), IoError, "no checkpoint at ", checkpoint_or_run_dir,
                        " (expected a .safetensors file or a run directory holding checkpoint.safetensors)");
  Checkpoint c = load_checkpoint(path);
  TrainedModel t;
  t.config.load_toml_string(c.config_toml, path + " (embedded config)");
  t.settings = run_settings(t.config);
  // The input channel count is the data's, not the config's: read it off the first convolution.
  auto first = c.model.find("encoder.0.weight");
  LOCKSTEP_THROW_IF_NOT(first != c.model.end() && first->second.dim() == 4, CorruptInput, path,
                        ": checkpoint has no encoder.0.weight of shape (out, in, kh, kw)");
  t.model = build_model(t.settings, t.config, first->second.size(1));
  LOCKSTEP_CHECK_ARG(!weight_average || !c.ema.empty(), path,
                     " holds no moving average of the weights: its run had train.ema_decay = 0");
  load_module_state(*t.model, weight_average ? c.ema : c.model, weight_average ? path + " (weight average)" : path);
  t.model->eval();
  t.step = c.step;
  t.checkpoint = path;
  return t;
}

}  // namespace lockstep::train
