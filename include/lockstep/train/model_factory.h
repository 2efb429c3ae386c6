// Builds the autoencoder and its quantizer that a configuration describes.
#pragma once

#include "lockstep/model/autoencoder.h"
#include "lockstep/quant/registry.h"
#include "lockstep/train/config.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::train {

// Reads "quantizer.<name>.<key>" from `config`.
quant::OptionReader quantizer_options(const Config& config, const std::string& name);
// The model that `settings` describe, its quantizer's options from `config`'s section of
// settings.quantizer.name. `in_channels` comes from the data (1 for Fashion-MNIST).
model::Autoencoder build_model(const RunSettings& settings, const Config& config, int64_t in_channels);

}  // namespace lockstep::train

namespace lockstep::train {

// A trained model restored from a checkpoint file or a run directory holding one.
struct TrainedModel {
  Config config{lockstep_schema()};  // the configuration embedded in the checkpoint
  RunSettings settings;              // the same, typed
  model::Autoencoder model{nullptr};
  int64_t step = 0;
  std::string checkpoint;  // the file it came from
};

// Rebuilds the model from the configuration embedded in the checkpoint and loads its weights, or
// with `weight_average` their moving average (InvalidArgument when the run kept none). Throws
// IoError when neither a file nor a run directory with a checkpoint is found.
TrainedModel load_trained_model(const std::string& checkpoint_or_run_dir, bool weight_average = false);

}  // namespace lockstep::train
