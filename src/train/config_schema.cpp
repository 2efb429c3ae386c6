// Every key `lockstep train` accepts: the run settings' table (run_settings.cpp), with each
// quantizer's section after quantizer.name.
#include "lockstep/core/error.h"
#include "lockstep/quant/option_specs.h"
#include "lockstep/train/config.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::train {
namespace {

// One quantizer option as a key of the configuration ("quantizer.vq." + "decay"): the same type, default,
// limits and choices.
KeySpec key_spec(const std::string& prefix, const quant::OptionSpec& o) {
  KeySpec k;
  static_cast<SettingSpec&>(k) = o;
  k.key = prefix + o.key;
  return k;
}

Schema build_schema() {
  Schema s;
  for (const RunKey& k : run_keys()) {
    s.add(k.spec);
    if (k.spec.key != "quantizer.name") continue;
    // Each quantizer's keys, defaults and limits as the library declares them (quant/option_specs.h).
    for (const auto& section : quant::quantizer_option_sections()) {
      for (const auto& option : section.options) s.add(key_spec("quantizer." + section.name + ".", option));
    }
  }
  return s;
}

}  // namespace

const Schema& lockstep_schema() {
  static const Schema schema = build_schema();
  return schema;
}

}  // namespace lockstep::train
