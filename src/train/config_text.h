// Text helpers shared by the schema (key_spec.cpp) and the Config (config.cpp): joining, quoting,
// numbers that read back exactly, and a key's limits in words. Internal to src/train.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/train/config.h"

namespace lockstep::train::config_text {

// Joins `parts` with ", ".
std::string join(const std::vector<std::string>& parts);
std::string trim(std::string_view s);
// "quantizer.fsq" for "quantizer.fsq.levels"; "" without a dot.
std::string parent_of(const std::string& dotted);
// Shortest text that reads back as the same double, always with a '.' or exponent.
std::string format_double(double v);
// A TOML basic string, escaped.
std::string quote(const std::string& s);

// Letters, digits, '_' and '-': a key part TOML accepts without quotes.
bool is_bare_key(const std::string& s);
// Converts an integer to a float where the key wants one, then checks type and limits; throws
// InvalidArgument naming the key and `where` (defined in config.cpp with the other checks).
Value checked(const KeySpec& spec, Value v, const std::string& where);

template <typename T, typename F>
std::string format_list(const std::vector<T>& items, F format_one) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + format_one(items[i]);
  return out + "]";
}

}  // namespace lockstep::train::config_text
