// One declaration per quantizer option. An options struct lists its fields once, in a .def file of
//   LOCKSTEP_FIELD(type, name, default, limits, help)
// lines (as LLVM's .def files), and expands that list twice: into each field's chaining setter,
// getter and member with its default (LOCKSTEP_FIELD_MEMBER), and into a visitor of every field
// (LOCKSTEP_FIELD_VISIT). The configuration's section (option_specs.cpp), the registry's reader and
// the limits that validate() checks are all derived from the visitor, so adding an option is one
// line in the .def file plus its use. Free of torch headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::quant {

// The values a number may take (each element's, for a list; numbers are also finite) and a list's
// length. Written in a .def line as a chain: at_least(0), greater_than(0).at_most(1), any().
struct FieldLimits {
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;
  std::optional<size_t> min_len, max_len;

  FieldLimits& any() { return *this; }
  FieldLimits& at_least(double lo) { return min = lo, min_exclusive = false, *this; }
  FieldLimits& greater_than(double lo) { return min = lo, min_exclusive = true, *this; }
  FieldLimits& at_most(double hi) { return max = hi, max_exclusive = false, *this; }
  FieldLimits& less_than(double hi) { return max = hi, max_exclusive = true, *this; }
  FieldLimits& in_range(double lo, double hi) { return at_least(lo).at_most(hi); }
  FieldLimits& length(size_t lo, size_t hi) { return min_len = lo, max_len = hi, *this; }

  bool admits(double value) const;
  // "> 0", "in (0, 1]", ">= 0", or "finite" when any finite number will do.
  std::string text() const;
};

// InvalidArgument "lfq: frac_per_sample_entropy = 2 must be in (0, 1]" unless `value` is within
// `limits`; `owner` names the options ("lfq").
void check_field(const char* owner, const char* key, double value, const FieldLimits& limits);
void check_field(const char* owner, const char* key, int64_t value, const FieldLimits& limits);
inline void check_field(const char*, const char*, bool, const FieldLimits&) {}
void check_field(const char* owner, const char* key, const std::vector<double>& values, const FieldLimits& limits);
void check_field(const char* owner, const char* key, const std::vector<int64_t>& values, const FieldLimits& limits);
inline void check_field(const char*, const char*, const std::string&, const FieldLimits&) {}

// Checks every declared field of `options` against its limits (validate()'s first step).
template <typename Options>
void check_fields(const char* owner, const Options& options) {
  Options::visit_fields(options, [owner](const char* key, const auto& value, const FieldLimits& limits, const char*) {
    check_field(owner, key, value, limits);
  });
}

}  // namespace lockstep::quant

// Inside the options struct `Options`: the field's chaining setter and getter, and its member.
#define LOCKSTEP_FIELD_MEMBER(Options, type, name, value) \
 public:                                                  \
  Options& name(type v) {                                 \
    name##_ = std::move(v);                               \
    return *this;                                         \
  }                                                       \
  const type& name() const { return name##_; }            \
                                                          \
 private:                                                 \
  type name##_ = value;                                   \
                                                          \
 public:

// Inside a function with `self` (the options) and `visit`: visit(key, member, limits, help).
#define LOCKSTEP_FIELD_VISIT(type, name, value, limits, help) \
  visit(#name, self.name##_, ::lockstep::quant::FieldLimits().limits, help);
