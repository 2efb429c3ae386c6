// A setting's value, its type and its limits, one vocabulary for the quantizers' options
// (quant/option_fields.h, quant/option_specs.h) and the configuration of `lockstep train`
// (train/config.h). Free of torch headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace lockstep {

// The order matches Value's alternatives, so ValueType(value.index()) is the value's type.
enum class ValueType { Bool, Int, Float, String, IntList, FloatList };
using Value = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;

// "an integer", "a list of numbers", ...: the wording of error messages and the docs.
std::string describe_type(ValueType type);

// The values a number may take (each element's, for a list; numbers are also finite) and a list's
// length, chained: Limits().at_least(0), Limits().greater_than(0).at_most(1), Limits().any().
struct Limits {
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;  // strict bounds: "> 0" rather than ">= 0"
  std::optional<size_t> min_len, max_len;             // lists

  Limits& any() { return *this; }
  Limits& at_least(double lo) { return min = lo, min_exclusive = false, *this; }
  Limits& greater_than(double lo) { return min = lo, min_exclusive = true, *this; }
  Limits& at_most(double hi) { return max = hi, max_exclusive = false, *this; }
  Limits& less_than(double hi) { return max = hi, max_exclusive = true, *this; }
  Limits& in_range(double lo, double hi) { return at_least(lo).at_most(hi); }
  Limits& length(size_t lo, size_t hi) { return min_len = lo, max_len = hi, *this; }

  // Finite and within the bounds.
  bool admits(double value) const;
  bool admits_length(size_t size) const;
  // "in [1, 65536]", "> 0", "<= 1", or "" without bounds.
  std::string range_text() const;
  // "1 to 16 elements", "at least 1 elements", or "" without bounds.
  std::string length_text() const;
};

// One setting's declaration: a quantizer option (quant::OptionSpec, its key within its section) or a
// configuration key (train::KeySpec, which adds how the CLI uses it).
struct SettingSpec {
  std::string key;
  ValueType type = ValueType::Int;
  Value default_value;
  std::string help;                  // one line, shown in the resolved config and the docs
  Limits limits;                     // of a number, of each element of a list, of a list's length
  std::vector<std::string> choices;  // for strings and integers (as text); empty means any
};

// A setting of its default's type.
SettingSpec setting_spec(std::string key, Value default_value, std::string help, Limits limits = {});

// A bound as range_text writes it: integers without a point ("4096"), others as the shortest text that
// reads back as the same double.
std::string format_bound(double value);

}  // namespace lockstep
