// Typed access to a quantizer's options, by key: the trainer backs it with the configuration
// ("quantizer.<section>.<key>"), the Python bindings and tests with the declared defaults and a map
// (default_option_reader, option_specs.h). Free of torch headers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep::quant {

// Typed access to one section's options; each function throws for an unknown key.
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

}  // namespace lockstep::quant
