#include "lockstep/core/setting.h"

#include <charconv>
#include <cmath>
#include <type_traits>
#include <utility>

namespace lockstep {

// ValueType(value.index()) is a value's type only while the two orders agree.
template <ValueType type, typename T>
constexpr bool holds_at = std::is_same_v<std::variant_alternative_t<static_cast<size_t>(type), Value>, T>;
static_assert(holds_at<ValueType::Bool, bool> && holds_at<ValueType::Int, int64_t> &&
                  holds_at<ValueType::Float, double> && holds_at<ValueType::String, std::string> &&
                  holds_at<ValueType::IntList, std::vector<int64_t>> &&
                  holds_at<ValueType::FloatList, std::vector<double>>,
              "ValueType follows Value's alternatives");

std::string describe_type(ValueType type) {
  switch (type) {
    case ValueType::Bool:
      return "a boolean (true or false)";
    case ValueType::Int:
      return "an integer";
    case ValueType::Float:
      return "a number";
    case ValueType::String:
      return "a string";
    case ValueType::IntList:
      return "a list of integers";
    case ValueType::FloatList:
      return "a list of numbers";
  }
  return "?";
}

SettingSpec setting_spec(std::string key, Value default_value, std::string help, Limits limits) {
  SettingSpec spec;
  spec.key = std::move(key);
  spec.type = static_cast<ValueType>(default_value.index());
  spec.default_value = std::move(default_value);
  spec.help = std::move(help);
  spec.limits = limits;
  return spec;
}

std::string format_bound(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return std::to_string(static_cast<int64_t>(v));
  char buf[64];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

bool Limits::admits(double value) const {
  if (!std::isfinite(value)) return false;
  if (min && (min_exclusive ? value <= *min : value < *min)) return false;
  return !(max && (max_exclusive ? value >= *max : value > *max));
}

bool Limits::admits_length(size_t size) const { return !(min_len && size < *min_len) && !(max_len && size > *max_len); }

std::string Limits::range_text() const {
  if (min && max) {
    return std::string("in ") + (min_exclusive ? "(" : "[") + format_bound(*min) + ", " + format_bound(*max) +
           (max_exclusive ? ")" : "]");
  }
  if (min) return (min_exclusive ? "> " : ">= ") + format_bound(*min);
  if (max) return (max_exclusive ? "< " : "<= ") + format_bound(*max);
  return "";
}

std::string Limits::length_text() const {
  if (min_len && max_len) return std::to_string(*min_len) + " to " + std::to_string(*max_len) + " elements";
  if (min_len) return "at least " + std::to_string(*min_len) + " elements";
  if (max_len) return "at most " + std::to_string(*max_len) + " elements";
  return "";
}

}  // namespace lockstep
