// The schema: KeySpec (a key's type, default and limits) and Schema (the table of keys).
#include <algorithm>

#include "config_text.h"
#include "lockstep/core/error.h"
#include "lockstep/train/config.h"

namespace lockstep::train {
using namespace config_text;

// ---- KeySpec ----

namespace {
KeySpec make_spec(std::string key, Value default_value, std::string help) {
  KeySpec spec;
  static_cast<SettingSpec&>(spec) = setting_spec(std::move(key), std::move(default_value), std::move(help));
  return spec;
}
}  // namespace

KeySpec KeySpec::boolean(std::string key, bool d, std::string help) {
  return make_spec(std::move(key), d, std::move(help));
}
KeySpec KeySpec::integer(std::string key, int64_t d, std::string help) {
  return make_spec(std::move(key), d, std::move(help));
}
KeySpec KeySpec::floating(std::string key, double d, std::string help) {
  return make_spec(std::move(key), d, std::move(help));
}
KeySpec KeySpec::string(std::string key, std::string d, std::string help) {
  return make_spec(std::move(key), std::move(d), std::move(help));
}
KeySpec KeySpec::int_list(std::string key, std::vector<int64_t> d, std::string help) {
  return make_spec(std::move(key), std::move(d), std::move(help));
}
KeySpec KeySpec::float_list(std::string key, std::vector<double> d, std::string help) {
  return make_spec(std::move(key), std::move(d), std::move(help));
}

KeySpec& KeySpec::at_least(double lo) {
  limits.at_least(lo);
  return *this;
}
KeySpec& KeySpec::greater_than(double lo) {
  limits.greater_than(lo);
  return *this;
}
KeySpec& KeySpec::at_most(double hi) {
  limits.at_most(hi);
  return *this;
}
KeySpec& KeySpec::less_than(double hi) {
  limits.less_than(hi);
  return *this;
}
KeySpec& KeySpec::in_range(double lo, double hi) {
  limits.in_range(lo, hi);
  return *this;
}
KeySpec& KeySpec::one_of(std::vector<std::string> allowed) {
  choices = std::move(allowed);
  return *this;
}
KeySpec& KeySpec::matching(std::string text, std::function<void(const std::string&)> fn) {
  check_text = std::move(text);
  check = std::move(fn);
  return *this;
}
KeySpec& KeySpec::length(size_t lo, size_t hi) {
  limits.length(lo, hi);
  return *this;
}

KeySpec& KeySpec::may_change_on_resume() {
  resumable = true;
  return *this;
}

KeySpec& KeySpec::may_differ_per_rank() {
  per_rank = true;
  return *this;
}

KeySpec& KeySpec::shortcut(std::string flag, std::string type_name, std::string help) {
  shortcuts.push_back({std::move(flag), std::move(type_name), std::move(help)});
  return *this;
}

std::string KeySpec::section() const { return parent_of(key); }
std::string KeySpec::name() const { return key.substr(key.rfind('.') + 1); }

std::string KeySpec::constraint_text() const {
  if (type == ValueType::String) return !choices.empty() ? "one of: " + join(choices) : check_text;
  if (type == ValueType::Int && !choices.empty()) return "one of: " + join(choices);
  bool list = type == ValueType::IntList || type == ValueType::FloatList;
  std::string range = limits.range_text();
  if (!list) return range;
  std::string len = limits.length_text();
  if (range.empty()) return len;
  return len.empty() ? "each " + range : len + ", each " + range;
}

// ---- Schema ----

void Schema::add(KeySpec spec) {
  std::string where = " (schema key '" + spec.key + "')";
  LOCKSTEP_CHECK_ARG(spec.key.find('.') != std::string::npos, "schema key '", spec.key,
                     "' must be dotted as section.name");
  std::stringstream parts(spec.key);
  for (std::string part; std::getline(parts, part, '.');) {
    LOCKSTEP_CHECK_ARG(is_bare_key(part), "schema key '", spec.key, "': '", part,
                       "' must be non-empty letters, digits, '_' or '-'");
  }
  LOCKSTEP_CHECK_ARG(index_.count(spec.key) == 0, "schema key '", spec.key, "' is added twice");
  LOCKSTEP_CHECK_ARG(!is_section(spec.key), "schema key '", spec.key, "' is already a section");
  for (std::string s = spec.section(); !s.empty(); s = parent_of(s)) {
    LOCKSTEP_CHECK_ARG(index_.count(s) == 0, "schema key '", spec.key, "' is inside '", s, "', which is a key");
  }
  spec.default_value = checked(spec, spec.default_value, where);
  index_[spec.key] = keys_.size();
  keys_.push_back(std::move(spec));
}

const KeySpec* Schema::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &keys_[it->second];
}

bool Schema::is_section(const std::string& section) const {
  if (section.empty()) return false;
  auto it = index_.lower_bound(section + ".");
  return it != index_.end() && it->first.compare(0, section.size() + 1, section + ".") == 0;
}

std::vector<std::string> Schema::sections() const {
  std::vector<std::string> out;
  for (const KeySpec& spec : keys_) {
    // Parents before children: "quantizer" before "quantizer.fsq".
    std::vector<std::string> chain;
    for (std::string s = spec.section(); !s.empty(); s = parent_of(s)) chain.push_back(s);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      if (std::find(out.begin(), out.end(), *it) == out.end()) out.push_back(*it);
    }
  }
  return out;
}

std::vector<std::string> Schema::keys_in_section(const std::string& section) const {
  std::vector<std::string> out;
  for (const KeySpec& spec : keys_) {
    if (spec.section() == section) out.push_back(spec.name());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> Schema::subsections(const std::string& section) const {
  std::vector<std::string> out;
  for (const std::string& s : sections()) {
    if (parent_of(s) == section) out.push_back(section.empty() ? s : s.substr(section.size() + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace lockstep::train
