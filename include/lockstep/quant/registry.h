// Quantizers by name, for the CLI and the tests. Each entry builds its quantizer from options
// read through an OptionReader, which the trainer backs with the configuration
// ("quantizer.<name>.<key>") and tests back with a map.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/quant/option_specs.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

struct RegistryEntry {
  std::string name;
  std::string summary;  // one line, for --help
  std::function<std::shared_ptr<Quantizer>(const OptionReader&)> make;
};

const std::vector<RegistryEntry>& quantizer_registry();
std::vector<std::string> quantizer_names();
// Throws InvalidArgument listing the registered names when `name` is unknown.
const RegistryEntry& find_quantizer(const std::string& name);
std::shared_ptr<Quantizer> make_quantizer(const std::string& name, const OptionReader& options);

}  // namespace lockstep::quant
