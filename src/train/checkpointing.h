// A run's checkpoint taken from what it trains, restored into it on resume, and the check that a
// resumed run's configuration is still the one its checkpoint trained with.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/train/checkpoint.h"
#include "lockstep/train/config.h"
#include "lockstep/train/run_settings.h"
#include "trained_modules.h"

namespace lockstep::train {

// Everything needed to continue exactly: the modules' states, torch's CPU generator, the step
// and the configuration.
Checkpoint capture_checkpoint(const TrainedModules& modules, int64_t step, const Config& config);

// Loads `checkpoint` (read from `path`) into `modules`, built from `settings`, and sets torch's CPU
// generator. Throws CorruptInput naming `path` when the checkpoint does not fit them (a weight
// average or a discriminator the settings do not have, or lack; another shape; a bad RNG state).
void restore_checkpoint(TrainedModules& modules, const Checkpoint& checkpoint, const std::string& path,
                        const RunSettings& settings);

// `resumed` (the run directory's config.toml and the overrides) against `saved` (the
// checkpoint's): a key the file lost must not fall back to its default, and only resumable keys
// may differ. Throws CorruptInput naming the keys and values.
void check_resumed_config(const Config& resumed, const Config& saved, const std::string& run_dir,
                          const std::string& checkpoint);

}  // namespace lockstep::train
