// The settings of `lockstep train` as typed structs, one per section of the configuration, each setting
// declared once, one line in its section's .def list (settings_data.def, ...): its type, name and default
// (the member's), its help, its limits and whether a resumed run or a single rank may change it; from
// those lines come the members and the table that binds each key to its member. The schema, the TOML
// reader and writer, the resume and per-rank checks and the docs check all read that table; code
// after parsing reads these members, never key strings. Quantizer options have their own tables
// (quant/option_specs.h); here only quantizer.name.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/train/config.h"

namespace lockstep::train {

// Each section's settings, declared once in its .def list (settings_data.def, ...): here as the struct's
// members, TORCH_ARG's chaining setter and getter with the setting's default.
#define LOCKSTEP_SETTING(type, name, value, help, uses) TORCH_ARG(type, name) = value;

struct DataSettings {
#include "lockstep/train/settings_data.def"
};

struct ModelSettings {
#include "lockstep/train/settings_model.def"
};

// The quantizer's own options stay in the configuration's quantizer.<name> section, read by the
// quantizer registry through quant/option_specs.h.
struct QuantizerSettings {
#include "lockstep/train/settings_quantizer.def"
};

struct TrainSettings {
#include "lockstep/train/settings_train.def"
};

struct LossSettings {
#include "lockstep/train/settings_loss.def"
};

struct EvalSettings {
#include "lockstep/train/settings_eval.def"
};

#undef LOCKSTEP_SETTING

struct RunSettings {
  DataSettings data;
  ModelSettings model;
  QuantizerSettings quantizer;
  TrainSettings train;
  LossSettings loss;
  EvalSettings eval;
};

// One key of the table: its schema entry and the member it is read into and written from.
struct RunKey {
  KeySpec spec;
  std::function<void(RunSettings&, const Value&)> read;
  std::function<Value(const RunSettings&)> write;
};

// Every key of RunSettings, in the configuration's order (src/train/run_settings.cpp).
const std::vector<RunKey>& run_keys();

// The typed settings of a configuration, as they are.
RunSettings read_run_settings(const Config& config);
// The same, checked across keys (check_run_settings).
RunSettings run_settings(const Config& config);

// Sets in `config` every key whose member in `settings` differs from it (a value the run chose,
// such as data.dataset = "auto" resolved), so that the recorded configuration is what ran.
void record_run_settings(const RunSettings& settings, Config& config);

// The checks that involve several keys, in one place; each key's own limits are the schema's.
// Throws InvalidArgument naming the keys and their values.
void check_run_settings(const RunSettings& settings);

// Keys a resumed run may change, and keys each rank may set for itself, in table order.
std::vector<std::string> resumable_keys();
std::vector<std::string> per_rank_keys();

}  // namespace lockstep::train
