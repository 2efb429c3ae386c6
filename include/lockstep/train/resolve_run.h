// The configuration and settings a run trains with, resolved once, the same way for the CLI (which
// needs the device before the process group exists) and for the trainer.
#pragma once

#include <string>
#include <vector>

#include "lockstep/train/config.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::train {

// Each key's own limits are checked here; the checks across keys (check_run_settings) are the
// trainer's, after a resumed run's configuration has been compared with its checkpoint's. What the data
// decides afterwards (a small image folder's global batch) the trainer writes into its settings, and from
// them into the step's shape and the record (recorded_config).
struct ResolvedRun {
  Config config{lockstep_schema()};  // every key as configured (what --print-config shows)
  RunSettings settings;              // the same, typed, data.dataset resolved (quantizer sections stay in config)
};

// A configuration's run: its settings read, data.dataset = "auto" resolved (resolve_dataset).
ResolvedRun resolve_config(Config config);

// What config.toml and the checkpoint record of a run: its configuration with its settings' values, the
// choices resolution and the data made (data.dataset; a small image folder's fitted train.batch_size).
Config recorded_config(const ResolvedRun& run);

// A new run: the defaults, then `config_file` (when not empty), then the "key=value" overrides in
// order. Every quantizer section is checked, not only the chosen one's: a value that would fail
// later is refused now. Throws InvalidArgument naming the key, or IoError for an unreadable file.
ResolvedRun resolve_new_run(const std::string& config_file, const std::vector<std::string>& overrides);

// A run being resumed: its directory's config.toml, then the overrides, which may change only
// keys marked resumable (run_settings.h). Throws IoError when the directory or its config.toml is
// missing, InvalidArgument for an override of another key.
ResolvedRun resolve_resumed_run(const std::string& run_dir, const std::vector<std::string>& overrides);

// The run's CUDA device index by train.device (-1: the CPU); under a launcher "cuda" is the rank's
// LOCAL_RANK'th GPU.
int cuda_device_index(const RunSettings& settings);

// data.dataset = "auto" resolved by what data.dir holds: fashion-mnist when its training images
// are there, folder when it is another directory, fashion-mnist (whose loader then names what is
// missing) otherwise. Other values are left as they are.
void resolve_dataset(DataSettings& data);

}  // namespace lockstep::train
