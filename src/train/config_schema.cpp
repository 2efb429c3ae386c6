// Every key `lockstep train` accepts: the run settings' table (run_settings.cpp), with each
// quantizer's section after quantizer.name.
#include "lockstep/core/error.h"
#include "lockstep/quant/option_specs.h"
#include "lockstep/train/config.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::train {
namespace {

// One quantizer option as a key of the configuration ("quantizer.vq." + "decay").
KeySpec key_spec(const std::string& prefix, const quant::OptionSpec& o) {
  using Type = quant::OptionSpec::Type;
  KeySpec k = o.type == Type::Bool    ? KeySpec::boolean(prefix + o.key, std::get<bool>(o.default_value), o.help)
              : o.type == Type::Int   ? KeySpec::integer(prefix + o.key, std::get<int64_t>(o.default_value), o.help)
              : o.type == Type::Float ? KeySpec::floating(prefix + o.key, std::get<double>(o.default_value), o.help)
              : o.type == Type::String
                  ? KeySpec::string(prefix + o.key, std::get<std::string>(o.default_value), o.help).one_of(o.choices)
              : o.type == Type::FloatList
                  ? KeySpec::float_list(prefix + o.key, std::get<std::vector<double>>(o.default_value), o.help)
                  : KeySpec::int_list(prefix + o.key, std::get<std::vector<int64_t>>(o.default_value), o.help);
  k.min = o.min;
  k.max = o.max;
  k.min_exclusive = o.min_exclusive;
  k.max_exclusive = o.max_exclusive;
  k.min_len = o.min_len;
  k.max_len = o.max_len;
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
