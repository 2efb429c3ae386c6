// One declaration per quantizer option. An options struct lists its fields once, in a .def file of
//   LOCKSTEP_FIELD(type, name, default, limits, help)
// lines (as LLVM's .def files; limits a chain of core/setting.h's Limits), and expands that list twice: into each
// field's chaining setter, getter and member with its default (LOCKSTEP_FIELD_MEMBER), and into a visitor of every
// field (LOCKSTEP_FIELD_VISIT). The configuration's section (option_specs.cpp), the registry's reader and the limits
// that validate() checks are all derived from the visitor, so adding an option is one line in the .def file plus its
// use. Free of torch headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/setting.h"

namespace lockstep::quant {

// InvalidArgument "lfq: frac_per_sample_entropy = 2 must be in (0, 1]" unless `value` is within
// `limits`; `owner` names the options ("lfq").
void check_field(const char* owner, const char* key, double value, const Limits& limits);
void check_field(const char* owner, const char* key, int64_t value, const Limits& limits);
inline void check_field(const char*, const char*, bool, const Limits&) {}
void check_field(const char* owner, const char* key, const std::vector<double>& values, const Limits& limits);
void check_field(const char* owner, const char* key, const std::vector<int64_t>& values, const Limits& limits);
inline void check_field(const char*, const char*, const std::string&, const Limits&) {}

// Checks every declared field of `options` against its limits (validate()'s first step).
template <typename Options>
void check_fields(const char* owner, const Options& options) {
  Options::visit_fields(options, [owner](const char* key, const auto& value, const Limits& limits, const char*) {
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
  visit(#name, self.name##_, ::lockstep::Limits().limits, help);
