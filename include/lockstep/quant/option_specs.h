// Every quantizer option, declared once: its key, default, limits and help, each a line of its options struct's
// field list (quant/*_options.def, option_fields.h), read by the section's reader (option_specs.cpp); only
// [quantizer.grouped]'s one key, which has no options struct, is declared there. The configuration schema of
// `lockstep train` is assembled from these sections ("quantizer.vq.decay"), and docs/quantizers.md's option
// tables from that schema, so the library, the CLI and the docs give the same defaults. Free of torch headers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lockstep/core/setting.h"
#include "lockstep/quant/option_reader.h"

namespace lockstep::quant {

// One option; its key is within its section ("decay").
using OptionSpec = SettingSpec;

// The options of one section of the configuration: "fsq", "lfq", "vq", "residual", ... (the layers
// of the residual-* quantizers read the plain quantizer's section).
struct OptionSection {
  std::string name;
  std::vector<OptionSpec> options;
  // Reads the section's options through a reader and checks them as its quantizer would, building
  // nothing: InvalidArgument naming the option. A run checks every section when it starts, the
  // chosen quantizer's and the others' (a bad value is never kept).
  std::function<void(const OptionReader&)> validate;
};

// Every section, in the order the configuration lists them.
const std::vector<OptionSection>& quantizer_option_sections();

// The declared defaults of `section`, with `overrides` on top, keyed "section.key"
// ({"vq.codebook_size", int64_t{64}}); section() reads the other sections the same way. Builds a
// quantizer by name without a configuration: make_quantizer("vq", default_option_reader("vq")).
// An override that is not declared, or of another type, throws InvalidArgument.
OptionReader default_option_reader(const std::string& section, std::map<std::string, Value> overrides = {});

}  // namespace lockstep::quant
