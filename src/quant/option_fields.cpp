#include "lockstep/quant/option_fields.h"

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {

template <typename T>
void check_number(const char* owner, const char* key, T value, const Limits& limits, const char* element = "") {
  LOCKSTEP_CHECK_ARG(limits.admits(static_cast<double>(value)), owner, ": ", key, element, " = ", value, " must be ",
                     limits.range_text().empty() ? "finite" : limits.range_text());
}

template <typename T>
void check_list(const char* owner, const char* key, const std::vector<T>& values, const Limits& limits) {
  LOCKSTEP_CHECK_ARG(!limits.min_len || values.size() >= *limits.min_len, owner, ": ", key, " has ", values.size(),
                     " elements; it needs at least ", limits.min_len.value_or(0));
  LOCKSTEP_CHECK_ARG(!limits.max_len || values.size() <= *limits.max_len, owner, ": ", key, " has ", values.size(),
                     " elements; it takes at most ", limits.max_len.value_or(0));
  for (size_t i = 0; i < values.size(); ++i) {
    check_number(owner, key, values[i], limits, ::lockstep::detail::concat("[", i, "]").c_str());
  }
}

}  // namespace

void throw_not_a_choice(const char* owner, const char* key, const std::string& name,
                        const std::vector<std::string>& names) {
  throw InvalidArgument(::lockstep::detail::concat(owner, ": ", key, " = '", name,
                                                   "' is not one of: ", ::lockstep::detail::concat_list(names)));
}

void check_field(const char* owner, const char* key, double value, const Limits& limits) {
  check_number(owner, key, value, limits);
}
void check_field(const char* owner, const char* key, int64_t value, const Limits& limits) {
  check_number(owner, key, value, limits);
}
void check_field(const char* owner, const char* key, const std::vector<double>& values, const Limits& limits) {
  check_list(owner, key, values, limits);
}
void check_field(const char* owner, const char* key, const std::vector<int64_t>& values, const Limits& limits) {
  check_list(owner, key, values, limits);
}

}  // namespace lockstep::quant
