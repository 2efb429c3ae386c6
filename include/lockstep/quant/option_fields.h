// One declaration per quantizer option. An options struct lists its options once, in a .def file of lines
// (as LLVM's .def files; limits a chain of core/setting.h's Limits, help one line), each of one kind:
//   LOCKSTEP_FIELD(type, name, default, limits, help)         a field: chaining setter, getter, member
//   LOCKSTEP_REQUIRED(type, name, cli_default, limits, help)  a constructor argument: setter, getter, member;
//                                                            no library default, the CLI's stated
//   LOCKSTEP_OPTIONAL(type, name, limits, help)              unset unless set: setter and std::optional member
//                                                            (the struct writes the getter and its fallback);
//                                                            its key's 0 means unset
//   LOCKSTEP_CHOICE(enum, name, default, help)               an enum, its key the value's name (choice_names)
//   LOCKSTEP_KEY(type, name, default, limits, help)          a key the struct's reader maps by hand (VQ's two
//                                                            estimator keys make one enum)
// and expands that list inside the struct through option_fields.inc: into the members, declared_defaults() (every
// option at its declared default) and a visitor of every option. The configuration's section and its reader
// (option_specs.cpp) and the limits that validate() checks come from the visitor, so adding an option is one line
// in the .def file plus its use. Free of torch headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lockstep/core/setting.h"

namespace lockstep::quant {

// The tag of an options struct's constructor of its declared defaults (option_fields.inc). Nothing converts to
// it (no list, empty or not), so Options({}) and Options({5}) stay the constructors they were.
class DeclaredDefaults {
  struct Key {};

 public:
  explicit DeclaredDefaults(Key) {}
  static DeclaredDefaults tag() { return DeclaredDefaults(Key{}); }
};

// How visit_fields hands over the kinds other than LOCKSTEP_FIELD (whose member it hands over as it is): a
// constructor argument's member; an optional's member (std::optional<T>); a choice's (the enum); a key alone,
// its default.
template <typename T>
struct Required {
  T& value;
};
template <typename T>
Required<T> required(T& member) {
  return {member};
}
template <typename T>
struct KeyOnly {
  T value;
};

template <typename T>
struct is_required : std::false_type {};
template <typename T>
struct is_required<Required<T>> : std::true_type {};
template <typename T>
struct is_key_only : std::false_type {};
template <typename T>
struct is_key_only<KeyOnly<T>> : std::true_type {};
template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};

[[noreturn]] void throw_not_a_choice(const char* owner, const char* key, const std::string& name,
                                     const std::vector<std::string>& names);

// A LOCKSTEP_CHOICE's key: the enum value's name, choice_names(value) (found by argument-dependent lookup, beside
// the enum) listing every value's name in the enum's order, from 0.
template <typename Enum>
const std::string& choice_name(Enum value) {
  return choice_names(value).at(static_cast<size_t>(value));
}
// The value named `name`; InvalidArgument "fsp: activation = 'relu' is not one of: tanh, sigmoid, ..." otherwise.
template <typename Enum>
Enum choice_from_name(const char* owner, const char* key, const std::string& name) {
  const std::vector<std::string>& names = choice_names(Enum{});
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<Enum>(i);
  }
  throw_not_a_choice(owner, key, name, names);
}

// InvalidArgument "lfq: frac_per_sample_entropy = 2 must be in (0, 1]" unless `value` is within
// `limits`; `owner` names the options ("lfq").
void check_field(const char* owner, const char* key, double value, const Limits& limits);
void check_field(const char* owner, const char* key, int64_t value, const Limits& limits);
inline void check_field(const char*, const char*, bool, const Limits&) {}
void check_field(const char* owner, const char* key, const std::vector<double>& values, const Limits& limits);
void check_field(const char* owner, const char* key, const std::vector<int64_t>& values, const Limits& limits);
inline void check_field(const char*, const char*, const std::string&, const Limits&) {}

// Checks every LOCKSTEP_FIELD of `options` against its limits (validate()'s first step). The other kinds'
// limits are the configuration's: validate() checks what the library takes of them (FSQ's levels beyond the
// CLI's 256, a dim of any size), and a choice is valid by its type.
template <typename Options>
void check_fields(const char* owner, const Options& options) {
  Options::visit_fields(options, [owner](const char* key, const auto& value, const Limits& limits, const char*) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (!is_required<T>::value && !is_key_only<T>::value && !is_optional<T>::value && !std::is_enum_v<T>) {
      check_field(owner, key, value, limits);
    }
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

// Inside the options struct: an optional's chaining setter and its member.
#define LOCKSTEP_OPTIONAL_MEMBER(Options, type, name) \
 public:                                              \
  Options& name(type v) {                             \
    name##_ = std::move(v);                           \
    return *this;                                     \
  }                                                   \
                                                      \
 private:                                             \
  std::optional<type> name##_;                        \
                                                      \
 public:

// Inside a function with `self` (the options) and `visit`: visit(key, member, limits, help), the member as
// the kind hands it over (above).
#define LOCKSTEP_FIELD_VISIT(type, name, value, limits, help) \
  visit(#name, self.name##_, ::lockstep::Limits().limits, help);
#define LOCKSTEP_REQUIRED_VISIT(type, name, value, limits, help) \
  visit(#name, ::lockstep::quant::required(self.name##_), ::lockstep::Limits().limits, help);
#define LOCKSTEP_OPTIONAL_VISIT(type, name, limits, help) visit(#name, self.name##_, ::lockstep::Limits().limits, help);
#define LOCKSTEP_CHOICE_VISIT(type, name, value, help) visit(#name, self.name##_, ::lockstep::Limits(), help);
#define LOCKSTEP_KEY_VISIT(type, name, value, limits, help) \
  visit(#name, ::lockstep::quant::KeyOnly<type>{value}, ::lockstep::Limits().limits, help);
