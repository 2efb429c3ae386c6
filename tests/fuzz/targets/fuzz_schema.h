// A schema with a key of every type and every kind of limit, nested sections included: the TOML
// and override parsers are the same for any schema (lockstep's own needs LibTorch to build).
#pragma once

#include <string>

#include "fuzz_check.h"
#include "lockstep/core/error.h"
#include "lockstep/train/config.h"

namespace lockstep::fuzz {

inline const train::Schema& schema() {
  static const train::Schema s = [] {
    using train::KeySpec;
    train::Schema out;
    out.add(KeySpec::boolean("train.flag", false, "A flag."));
    out.add(KeySpec::integer("train.count", 64, "A bounded integer.").in_range(1, 65536));
    out.add(KeySpec::floating("train.rate", 1e-3, "A float in (0, 10].").greater_than(0).at_most(10));
    out.add(KeySpec::floating("train.any", 0.5, "Any float."));
    out.add(KeySpec::string("data.kind", "fsq", "One of three.").one_of({"fsq", "vq", "lfq"}));
    out.add(KeySpec::string("data.path", "", "Any text."));
    out.add(KeySpec::string("train.device", "cpu", "A pattern.").matching("cpu or gpu:N", [](const std::string& t) {
      if (t != "cpu" && t.rfind("gpu:", 0) != 0) throw InvalidArgument("not cpu or gpu:N");
    }));
    out.add(KeySpec::int_list("model.channels", {32, 64}, "1 to 5 sizes.").length(1, 5).in_range(1, 1024));
    out.add(KeySpec::float_list("quantizer.fsq.scales", {0.5}, "Any floats."));
    out.add(KeySpec::integer("quantizer.fsq.deep.level", 3, "Three sections deep.").at_least(0));
    return out;
  }();
  return s;
}

// Writing the config as TOML and reading it back gives every key the same value.
inline void require_round_trip(const train::Config& config) {
  train::Config again(schema());
  again.load_toml_string(config.to_toml(), "round trip");
  for (const auto& spec : schema().keys()) {
    require(train::format_value(again.get(spec.key)) == train::format_value(config.get(spec.key)),
            "to_toml then load_toml_string reproduces every value");
  }
}

}  // namespace lockstep::fuzz
