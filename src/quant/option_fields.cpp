#include "lockstep/quant/option_fields.h"

#include <cmath>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {

std::string bound(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

template <typename T>
void check_number(const char* owner, const char* key, T value, const FieldLimits& limits, const char* element = "") {
  LOCKSTEP_CHECK_ARG(limits.admits(static_cast<double>(value)), owner, ": ", key, element, " = ", value, " must be ",
                     limits.text());
}

template <typename T>
void check_list(const char* owner, const char* key, const std::vector<T>& values, const FieldLimits& limits) {
  LOCKSTEP_CHECK_ARG(!limits.min_len || values.size() >= *limits.min_len, owner, ": ", key, " has ", values.size(),
                     " elements; it needs at least ", limits.min_len.value_or(0));
  LOCKSTEP_CHECK_ARG(!limits.max_len || values.size() <= *limits.max_len, owner, ": ", key, " has ", values.size(),
                     " elements; it takes at most ", limits.max_len.value_or(0));
  for (size_t i = 0; i < values.size(); ++i) {
    check_number(owner, key, values[i], limits, ::lockstep::detail::concat("[", i, "]").c_str());
  }
}

}  // namespace

bool FieldLimits::admits(double value) const {
  if (!std::isfinite(value)) return false;
  if (min && (min_exclusive ? value <= *min : value < *min)) return false;
  return !(max && (max_exclusive ? value >= *max : value > *max));
}

std::string FieldLimits::text() const {
  if (min && max) {
    return std::string("in ") + (min_exclusive ? "(" : "[") + bound(*min) + ", " + bound(*max) +
           (max_exclusive ? ")" : "]");
  }
  if (min) return (min_exclusive ? "> " : ">= ") + bound(*min);
  if (max) return (max_exclusive ? "< " : "<= ") + bound(*max);
  return "finite";
}

void check_field(const char* owner, const char* key, double value, const FieldLimits& limits) {
  check_number(owner, key, value, limits);
}
void check_field(const char* owner, const char* key, int64_t value, const FieldLimits& limits) {
  check_number(owner, key, value, limits);
}
void check_field(const char* owner, const char* key, const std::vector<double>& values, const FieldLimits& limits) {
  check_list(owner, key, values, limits);
}
void check_field(const char* owner, const char* key, const std::vector<int64_t>& values, const FieldLimits& limits) {
  check_list(owner, key, values, limits);
}

}  // namespace lockstep::quant
