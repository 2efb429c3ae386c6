#include "lockstep/train/resolve_run.h"

#include <filesystem>
#include <system_error>

#include "lockstep/core/error.h"
#include "lockstep/data/image_set.h"
#include "lockstep/quant/option_check.h"
#include "lockstep/train/device.h"
#include "lockstep/train/model_factory.h"
#include "lockstep/train/run_dir.h"

namespace lockstep::train {

ResolvedRun resolve_new_run(const std::string& config_file, const std::vector<std::string>& overrides) {
  ResolvedRun run;
  if (!config_file.empty()) run.config.load_toml_file(config_file);
  for (const auto& assignment : overrides) run.config.set_from_string(assignment);
  for (const auto& section : quant::option_sections()) {
    try {
      quant::validate_options(section, quantizer_options(run.config, section));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("[quantizer.") + section + "] " + e.what());
    }
  }
  run.settings = read_run_settings(run.config);
  return run;
}

ResolvedRun resolve_resumed_run(const std::string& run_dir, const std::vector<std::string>& overrides) {
  LOCKSTEP_THROW_IF_NOT(std::filesystem::is_directory(run_dir), IoError, "cannot resume: ", run_dir,
                        " is not a directory");
  ResolvedRun run;
  run.config.load_toml_file(config_path(run_dir));
  const std::vector<std::string> resumable = resumable_keys();
  for (const auto& assignment : overrides) {
    std::string key = assignment.substr(0, assignment.find('='));
    key.erase(0, key.find_first_not_of(" \t"));
    key.erase(key.find_last_not_of(" \t") + 1);
    const KeySpec* spec = run.config.schema().find(key);
    LOCKSTEP_CHECK_ARG(spec != nullptr && spec->resumable, "cannot change '", key,
                       "' when resuming: it would change the model or the data order; keys a resumed run may change: ",
                       detail::concat_list(resumable));
    run.config.set_from_string(assignment);
  }
  run.settings = read_run_settings(run.config);
  return run;
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
