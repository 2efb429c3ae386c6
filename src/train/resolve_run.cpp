#include "lockstep/train/resolve_run.h"

#include <filesystem>
#include <system_error>

#include "lockstep/core/error.h"
#include "lockstep/data/image_set.h"
#include "lockstep/quant/option_specs.h"
#include "lockstep/train/device.h"
#include "lockstep/train/model_factory.h"
#include "lockstep/train/run_dir.h"

namespace lockstep::train {

ResolvedRun resolve_new_run(const std::string& config_file, const std::vector<std::string>& overrides) {
  Config config{lockstep_schema()};
  if (!config_file.empty()) config.load_toml_file(config_file);
  for (const auto& assignment : overrides) config.set_from_string(assignment);
  for (const auto& section : quant::quantizer_option_sections()) {
    try {
      section.validate(quantizer_options(config, section.name));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("[quantizer." + section.name + "] " + e.what());
    }
  }
  return resolve_config(std::move(config));
}

ResolvedRun resolve_resumed_run(const std::string& run_dir, const std::vector<std::string>& overrides) {
  LOCKSTEP_THROW_IF_NOT(std::filesystem::is_directory(run_dir), IoError, "cannot resume: ", run_dir,
                        " is not a directory");
  Config config{lockstep_schema()};
  config.load_toml_file(config_path(run_dir));
  const std::vector<std::string> resumable = resumable_keys();
  for (const auto& assignment : overrides) {
    std::string key = assignment.substr(0, assignment.find('='));
    key.erase(0, key.find_first_not_of(" \t"));
    key.erase(key.find_last_not_of(" \t") + 1);
    const KeySpec* spec = config.schema().find(key);
    LOCKSTEP_CHECK_ARG(spec != nullptr && spec->resumable, "cannot change '", key,
                       "' when resuming: it would change the model or the data order; keys a resumed run may change: ",
                       detail::concat_list(resumable));
    config.set_from_string(assignment);
  }
  // A relative data.dir was taken from the directory the run started in; from another, it names nothing.
  const std::string data_dir = config.get_string("data.dir");
  LOCKSTEP_THROW_IF_NOT(
      data_dir.empty() || std::filesystem::path(data_dir).is_absolute() || std::filesystem::exists(data_dir), IoError,
      "cannot resume ", run_dir, ": its data.dir '", data_dir,
      "' is relative, and there is no such path under this directory (", std::filesystem::current_path().string(),
      "); resume from the directory the run was started in, or give --set data.dir=PATH");
  return resolve_config(std::move(config));
}

ResolvedRun resolve_config(Config config) {
  ResolvedRun run;
  run.config = std::move(config);
  run.settings = read_run_settings(run.config);
  resolve_dataset(run.settings.data);  // a new run's "auto"; a resumed run's config.toml records the choice
  return run;
}

Config recorded_config(const ResolvedRun& run) {
  Config record = run.config;
  record_run_settings(run.settings, record);
  return record;
}

int cuda_device_index(const RunSettings& settings) {
  return cuda_index_for(parse_device_spec(settings.train.device()));
}

void resolve_dataset(DataSettings& data) {
  if (data.dataset() != "auto") return;
  // Without throwing for a name the system refuses (too long): the loader then says what is wrong.
  std::error_code ec;
  const bool mnist = std::filesystem::exists(data::fashion_mnist_images_path(data.dir(), data::Split::Train), ec);
  // A missing Fashion-MNIST directory keeps its own error (which names the Debian package).
  const bool folder = !mnist && std::filesystem::is_directory(data.dir(), ec);
  data.dataset(folder ? "folder" : "fashion-mnist");
}

}  // namespace lockstep::train
