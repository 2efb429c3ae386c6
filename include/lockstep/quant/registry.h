// Quantizers by name, for the CLI and the tests. Each entry builds its quantizer from options
// read through an OptionReader, which the trainer backs with the configuration
// ("quantizer.<name>.<key>") and tests back with a map.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

// Typed access to one quantizer's options; each function throws for an unknown key.
struct OptionReader {
  // The reader of another section ("vq", "residual", ...): composite quantizers such as residual-vq
  // read their layers' options where the plain quantizer keeps them.
  std::function<OptionReader(const std::string&)> section;
  std::function<int64_t(const std::string&)> integer;
  std::function<double(const std::string&)> real;
  std::function<bool(const std::string&)> boolean;
  std::function<std::string(const std::string&)> string;
  std::function<std::vector<int64_t>(const std::string&)> int_list;
  std::function<std::vector<double>(const std::string&)> float_list;
};

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

// The declared defaults (option_specs.h) of `section`, with `overrides` on top, keyed
// "section.key" ({"vq.codebook_size", int64_t{64}}); section() reads the other sections the same way.
// Build a quantizer by name without a configuration: make_quantizer("vq", default_option_reader("vq")).
// Reading a key that is not declared, or as another type, throws InvalidArgument.
using OptionValue = std::variant<bool, int64_t, double, std::vector<int64_t>, std::string, std::vector<double>>;
OptionReader default_option_reader(const std::string& section, std::map<std::string, OptionValue> overrides = {});

}  // namespace lockstep::quant
