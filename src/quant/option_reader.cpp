#include <algorithm>
#include <memory>

#include "lockstep/core/error.h"
#include "lockstep/quant/option_specs.h"

namespace lockstep::quant {

namespace {
// The declaration of "section.key", or nullptr.
const OptionSpec* find_spec(const std::string& section, const std::string& key) {
  for (const auto& s : quantizer_option_sections()) {
    if (s.name != section) continue;
    for (const auto& o : s.options) {
      if (o.key == key) return &o;
    }
  }
  return nullptr;
}

// An override checked against its declaration: its key, its type (an integer is taken for a number)
// and, for a string, its choices. Returns the value as declared; InvalidArgument naming the option.
// The numeric limits stated here are the configuration's (KeySpec); the library's own, which the
// options' validate() applies to whatever reads them, may be wider (FSQ levels up to 2^22).
Value checked_override(const std::string& name, const Value& given) {
  const auto dot = name.find('.');
  const OptionSpec* spec = dot == std::string::npos ? nullptr : find_spec(name.substr(0, dot), name.substr(dot + 1));
  if (spec == nullptr) {
    std::vector<std::string> keys;
    for (const auto& s : quantizer_option_sections()) {
      if (s.name != name.substr(0, dot)) continue;
      for (const auto& o : s.options) keys.push_back(o.key);
    }
    throw InvalidArgument(keys.empty() ? lockstep::detail::concat("unknown quantizer option '", name, "'")
                                       : lockstep::detail::concat("unknown quantizer option '", name,
                                                                  "'; the options of ", name.substr(0, dot), ": ",
                                                                  lockstep::detail::concat_list(keys)));
  }
  Value value = given;
  if (spec->type == ValueType::Float && std::holds_alternative<int64_t>(value)) {
    value = static_cast<double>(std::get<int64_t>(value));
  }
  if (spec->type == ValueType::FloatList && std::holds_alternative<std::vector<int64_t>>(value)) {
    const auto& ints = std::get<std::vector<int64_t>>(value);  // [1, 2] is a list of numbers too
    value = std::vector<double>(ints.begin(), ints.end());
  }
  LOCKSTEP_CHECK_ARG(static_cast<ValueType>(value.index()) == spec->type, "quantizer option '", name, "' must be ",
                     describe_type(spec->type));
  if (const auto* text = std::get_if<std::string>(&value)) {
    LOCKSTEP_CHECK_ARG(
        spec->choices.empty() || std::find(spec->choices.begin(), spec->choices.end(), *text) != spec->choices.end(),
        "quantizer option '", name, "' = \"", *text,
        "\" is not one of: ", lockstep::detail::concat_list(spec->choices));
  }
  return value;
}

template <typename T>
T declared(const std::string& section, const std::string& key, const std::map<std::string, Value>& overrides) {
  const std::string name = section + "." + key;
  const OptionSpec* spec = find_spec(section, key);
  LOCKSTEP_CHECK_ARG(spec != nullptr, "no quantizer option '", name, "' is declared");
  const Value* value = &spec->default_value;
  if (auto it = overrides.find(name); it != overrides.end()) value = &it->second;
  LOCKSTEP_CHECK_ARG(std::holds_alternative<T>(*value), "quantizer option '", name, "' is read as another type");
  return std::get<T>(*value);
}
}  // namespace

OptionReader default_option_reader(const std::string& section, std::map<std::string, Value> overrides) {
  // Every override is a declared option of its type: a misspelt key is an error here, as in the
  // configuration, not a value silently left unread.
  for (auto& [name, value] : overrides) value = checked_override(name, value);
  const auto o = std::make_shared<const std::map<std::string, Value>>(std::move(overrides));
  OptionReader r;
  r.integer = [section, o](const std::string& key) { return declared<int64_t>(section, key, *o); };
  r.real = [section, o](const std::string& key) { return declared<double>(section, key, *o); };
  r.boolean = [section, o](const std::string& key) { return declared<bool>(section, key, *o); };
  r.int_list = [section, o](const std::string& key) { return declared<std::vector<int64_t>>(section, key, *o); };
  r.string = [section, o](const std::string& key) { return declared<std::string>(section, key, *o); };
  r.float_list = [section, o](const std::string& key) { return declared<std::vector<double>>(section, key, *o); };
  r.section = [o](const std::string& other) { return default_option_reader(other, *o); };
  return r;
}

}  // namespace lockstep::quant
