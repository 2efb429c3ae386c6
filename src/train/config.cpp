// Config: validation against the schema, TOML loading and writing, and "key=value" overrides.
#include "lockstep/train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "config_text.h"
#include "lockstep/core/error.h"
#include "lockstep/core/utf8.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/io/nesting.h"

namespace lockstep::train {
using namespace config_text;

namespace {

// "integer 5", "string \"abc\"": what a value of the wrong type was.
std::string describe_value(const Value& v) {
  static const char* kinds[] = {"boolean", "integer", "float", "string", "list", "list"};
  return std::string(kinds[v.index()]) + " " + format_value(v);
}

[[noreturn]] void fail(const std::string& what, const std::string& where, const std::string& hint = "") {
  throw InvalidArgument(what + where + (hint.empty() ? "" : "; " + hint));
}

[[noreturn]] void fail_type(const KeySpec& spec, const std::string& got, const std::string& where) {
  fail(spec.key + " must be " + describe_type(spec.type) + ", got " + got, where);
}

// Throws when the number `x` (shown as `shown`, e.g. "model.channels[1] = 2000") breaks the limits.
void check_number(const KeySpec& spec, double x, const std::string& shown, const std::string& where) {
  if (!std::isfinite(x)) fail(shown + " is not a finite number", where);
  if (!spec.limits.admits(x)) fail(shown + " is out of range: must be " + spec.limits.range_text(), where);
}

template <typename T>
void check_list(const KeySpec& spec, const std::vector<T>& items, const std::string& where) {
  if (!spec.limits.admits_length(items.size())) {
    // A list of 60,000 elements is shown by its start, not echoed whole.
    const std::vector<T> start(items.begin(),
                               items.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(items.size(), 8)));
    std::string shown = format_list(start, [](T x) { return format_value(Value(x)); });
    if (start.size() < items.size()) shown.insert(shown.size() - 1, ", ...");
    fail(spec.key + " = " + shown + " has " + std::to_string(items.size()) + " elements, must have " +
             spec.limits.length_text(),
         where);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    check_number(spec, static_cast<double>(items[i]),
                 spec.key + "[" + std::to_string(i) + "] = " + format_value(Value(items[i])), where);
  }
}

// "valid keys in [train]: batch_size, ..." plus the sections nested under it, if any.
std::string section_hint(const Schema& schema, const std::string& section) {
  std::string hint;
  std::vector<std::string> keys = schema.keys_in_section(section);
  if (!keys.empty()) hint = "valid keys in [" + section + "]: " + join(keys);
  std::vector<std::string> subs = schema.subsections(section);
  for (std::string& s : subs) s = detail::concat("[", section, ".", s, "]");
  if (!subs.empty()) hint += (hint.empty() ? "" : "; ") + ("sections in [" + section + "]: " + join(subs));
  return hint;
}

std::string sections_hint(const Schema& schema) {
  std::vector<std::string> all = schema.sections();
  std::sort(all.begin(), all.end());
  return "valid sections: " + join(all);
}

// `key` is not in the schema: name the first unknown section in it, or list the keys of its section.
[[noreturn]] void fail_unknown(const Schema& schema, const std::string& key, const std::string& where, bool is_table) {
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
    std::string prefix = key.substr(0, dot);
    if (!schema.is_section(prefix)) {
      fail(detail::concat("unknown section [", prefix, "] in key '", key, "'"), where, sections_hint(schema));
    }
  }
  if (is_table) fail("unknown section [" + key + "]", where, sections_hint(schema));
  std::string section = parent_of(key);
  if (section.empty()) fail("unknown key '" + key + "'", where, "every key is in a section; " + sections_hint(schema));
  fail("unknown key '" + key + "'", where, section_hint(schema, section));
}

std::string where_in(const std::string& origin, const toml::node& node) {
  auto line = node.source().begin.line;
  return " (" + origin + (line > 0 ? ", line " + std::to_string(line) : "") + ")";
}

// An array is written element by element: toml++'s array formatter estimates line widths with
// size_t(log10(x)), undefined behaviour for a float below 1 (found by fuzz_config_toml).
std::string node_text(const toml::node& node) {
  if (node.is_string()) return quote(node.as_string()->get());  // toml++ would use '...'
  if (node.is_table()) return "{...}";
  if (node.is_floating_point()) return format_double(node.as_floating_point()->get());
  std::ostringstream out;
  if (const toml::array* array = node.as_array()) {
    out << "[";
    for (size_t i = 0; i < array->size(); ++i) out << (i ? ", " : "") << node_text(*array->get(i));
    out << "]";
    return out.str();
  }
  node.visit([&](auto&& n) { out << n; });
  return out.str();
}

std::string describe_node(const toml::node& node) {
  static const std::map<toml::node_type, std::string> kinds = {{toml::node_type::table, "table"},
                                                               {toml::node_type::array, "array"},
                                                               {toml::node_type::string, "string"},
                                                               {toml::node_type::integer, "integer"},
                                                               {toml::node_type::floating_point, "float"},
                                                               {toml::node_type::boolean, "boolean"},
                                                               {toml::node_type::date, "date"},
                                                               {toml::node_type::time, "time"},
                                                               {toml::node_type::date_time, "date-time"}};
  if (node.is_table()) return "a table";
  return kinds.at(node.type()) + " " + node_text(node);
}

// One list element or scalar of type `t`; nullopt when the node holds something else.
std::optional<Value> scalar_from_node(ValueType t, const toml::node& node) {
  if (t == ValueType::Bool && node.is_boolean()) return Value(node.as_boolean()->get());
  if (t == ValueType::Int && node.is_integer()) return Value(node.as_integer()->get());
  if (t == ValueType::Float && node.is_floating_point()) return Value(node.as_floating_point()->get());
  if (t == ValueType::Float && node.is_integer()) return Value(static_cast<double>(node.as_integer()->get()));
  if (t == ValueType::String && node.is_string()) return Value(node.as_string()->get());
  return std::nullopt;
}

template <typename T>
Value list_from_node(const KeySpec& spec, ValueType element, const toml::array& array, const std::string& where) {
  std::vector<T> items;
  for (size_t i = 0; i < array.size(); ++i) {
    std::optional<Value> v = scalar_from_node(element, array[i]);
    if (!v) fail_type(spec, describe_node(array[i]) + " as element " + std::to_string(i), where);
    items.push_back(std::get<T>(*v));
  }
  return items;
}

Value from_node(const KeySpec& spec, const toml::node& node, const std::string& where) {
  if (spec.type == ValueType::IntList || spec.type == ValueType::FloatList) {
    const toml::array* array = node.as_array();
    if (!array) fail_type(spec, describe_node(node), where);
    if (spec.type == ValueType::IntList) return list_from_node<int64_t>(spec, ValueType::Int, *array, where);
    return list_from_node<double>(spec, ValueType::Float, *array, where);
  }
  std::optional<Value> v = scalar_from_node(spec.type, node);
  if (!v) fail_type(spec, describe_node(node), where);
  return *v;
}

// Walks a parsed TOML table, converting and checking every value into `out`.
void collect(const Schema& schema, const toml::table& table, const std::string& prefix, const std::string& origin,
             std::map<std::string, Value>& out) {
  for (auto&& [name, node] : table) {
    std::string key = prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    std::string where = where_in(origin, node);
    if (const KeySpec* spec = schema.find(key)) {
      out[key] = checked(*spec, from_node(*spec, node, where), where);
    } else if (schema.is_section(key) && node.is_table()) {
      collect(schema, *node.as_table(), key, origin, out);
    } else if (schema.is_section(key)) {
      fail("'" + key + "' is a section, not a key", where, section_hint(schema, key));
    } else {
      fail_unknown(schema, key, where, node.is_table());
    }
  }
}

// One override element of type `t` ("64", "1e-3", "true", "fsq"); nullopt when it does not parse.
std::optional<Value> scalar_from_text(ValueType t, const std::string& text) {
  const char* begin = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
  const char* end = text.data() + text.size();
  if (t == ValueType::Bool && (text == "true" || text == "false")) return Value(text == "true");
  if (t == ValueType::Int) {
    int64_t x = 0;
    auto [ptr, ec] = std::from_chars(begin, end, x);
    if (ec == std::errc() && ptr == end && begin != end) return Value(x);
  }
  if (t == ValueType::Float) {
    double x = 0;
    auto [ptr, ec] = std::from_chars(begin, end, x);
    if (ec == std::errc() && ptr == end && begin != end) return Value(x);
  }
  if (t == ValueType::String) {
    bool quoted = text.size() >= 2 && (text[0] == '"' || text[0] == '\'') && text.back() == text[0];
    return Value(quoted ? text.substr(1, text.size() - 2) : text);
  }
  return std::nullopt;
}

template <typename T>
Value list_from_text(const KeySpec& spec, ValueType element, std::string text, const std::string& where) {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') text = trim(text.substr(1, text.size() - 2));
  std::vector<T> items;
  if (text.empty()) return items;
  std::stringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ',')) {
    std::optional<Value> v = scalar_from_text(element, trim(part));
    if (!v) fail_type(spec, "'" + trim(part) + "' as element " + std::to_string(items.size()), where);
    items.push_back(std::get<T>(*v));
  }
  if (text.back() == ',') fail_type(spec, "an empty element after the last ','", where);
  return items;
}

Value from_text(const KeySpec& spec, const std::string& text, const std::string& where) {
  if (spec.type == ValueType::IntList) return list_from_text<int64_t>(spec, ValueType::Int, text, where);
  if (spec.type == ValueType::FloatList) return list_from_text<double>(spec, ValueType::Float, text, where);
  std::optional<Value> v = scalar_from_text(spec.type, text);
  if (!v) fail_type(spec, "'" + text + "'", where);
  return *v;
}

}  // namespace

// Converts an integer to a float where the key wants one, then checks type and limits.
Value config_text::checked(const KeySpec& spec, Value v, const std::string& where) {
  if (spec.type == ValueType::Float && std::holds_alternative<int64_t>(v)) {
    v = static_cast<double>(std::get<int64_t>(v));
  }
  if (spec.type == ValueType::FloatList && std::holds_alternative<std::vector<int64_t>>(v)) {
    const auto& ints = std::get<std::vector<int64_t>>(v);
    v = std::vector<double>(ints.begin(), ints.end());
  }
  if (static_cast<ValueType>(v.index()) != spec.type) fail_type(spec, describe_value(v), where);
  switch (spec.type) {
    case ValueType::Bool:
      break;
    case ValueType::Int:
      check_number(spec, static_cast<double>(std::get<int64_t>(v)), spec.key + " = " + format_value(v), where);
      // An integer key may take a few values only (data.channels: 1 or 3), listed as text.
      if (!spec.choices.empty() &&
          std::find(spec.choices.begin(), spec.choices.end(), format_value(v)) == spec.choices.end()) {
        fail(spec.key + " = " + format_value(v) + " is not valid", where, "choose one of: " + join(spec.choices));
      }
      break;
    case ValueType::Float:
      check_number(spec, std::get<double>(v), spec.key + " = " + format_value(v), where);
      break;
    case ValueType::String: {
      const auto& s = std::get<std::string>(v);
      // config.toml must read back on resume, and TOML is UTF-8.
      if (!is_utf8(s)) {
        fail(spec.key + " = \"" + escape_bytes(s) + "\" is not valid", where,
             "use UTF-8 text (the run's config.toml must read back)");
      }
      if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
        fail(spec.key + " = " + quote(s) + " is not valid", where, "choose one of: " + join(spec.choices));
      }
      if (spec.check) {
        try {
          spec.check(s);
        } catch (const std::exception& e) {
          fail(spec.key + " = " + quote(s) + " is not valid: " + e.what(), where, "use " + spec.check_text);
        }
      }
      break;
    }
    case ValueType::IntList:
      check_list(spec, std::get<std::vector<int64_t>>(v), where);
      break;
    case ValueType::FloatList:
      check_list(spec, std::get<std::vector<double>>(v), where);
      break;
  }
  return v;
}

// ---- Config ----

Config::Config(const Schema& schema) : schema_(&schema) {}

void Config::load_toml_file(const std::string& path) { load_toml_string(io::read_file(path), "config file " + path); }

void Config::load_toml_string(std::string_view text, const std::string& origin) {
  io::check_nesting(io::toml_nesting_depth(text), io::kMaxTomlNesting, origin);
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    throw InvalidArgument("invalid TOML in " + origin + ", line " + std::to_string(at.line) + ", column " +
                          std::to_string(at.column) + ": " + std::string(e.description()));
  }
  std::map<std::string, Value> loaded;  // applied only when the whole text is valid
  collect(*schema_, root, "", origin, loaded);
  for (auto& [key, value] : loaded) set_values_[key] = std::move(value);
}

void Config::set(const std::string& key, Value value) {
  const KeySpec* spec = schema_->find(key);
  if (!spec) fail_unknown(*schema_, key, "", false);
  set_values_[key] = checked(*spec, std::move(value), "");
}

void Config::set_from_string(const std::string& assignment) {
  // Quoted whole only when short: a 400 KB list is named by its start and its size.
  const std::string shown = assignment.size() <= 200 ? assignment
                                                     : assignment.substr(0, 160) + "... (" +
                                                           std::to_string(assignment.size()) + " characters)";
  size_t eq = assignment.find('=');
  std::string key = trim(std::string_view(assignment).substr(0, eq));
  if (eq == std::string::npos || key.empty()) {
    throw InvalidArgument("invalid override '" + shown + "': expected key=value, e.g. train.lr=1e-3");
  }
  std::string where = " (override '" + shown + "')";
  const KeySpec* spec = schema_->find(key);
  if (!spec) fail_unknown(*schema_, key, where, false);
  Value value = from_text(*spec, trim(std::string_view(assignment).substr(eq + 1)), where);
  set_values_[key] = checked(*spec, std::move(value), where);
}

const Value& Config::get(const std::string& key) const {
  const KeySpec* spec = schema_->find(key);
  if (!spec) fail_unknown(*schema_, key, "", false);
  auto it = set_values_.find(key);
  return it == set_values_.end() ? spec->default_value : it->second;
}

namespace {
template <typename T>
const T& get_as(const Value& v, const std::string& key, ValueType wanted) {
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw InvalidArgument("config key '" + key + "' holds " + describe_type(static_cast<ValueType>(v.index())) +
                        ", not " + describe_type(wanted));
}
}  // namespace

bool Config::get_bool(const std::string& key) const { return get_as<bool>(get(key), key, ValueType::Bool); }
int64_t Config::get_int(const std::string& key) const { return get_as<int64_t>(get(key), key, ValueType::Int); }
double Config::get_float(const std::string& key) const { return get_as<double>(get(key), key, ValueType::Float); }
const std::string& Config::get_string(const std::string& key) const {
  return get_as<std::string>(get(key), key, ValueType::String);
}
const std::vector<int64_t>& Config::get_int_list(const std::string& key) const {
  return get_as<std::vector<int64_t>>(get(key), key, ValueType::IntList);
}
const std::vector<double>& Config::get_float_list(const std::string& key) const {
  return get_as<std::vector<double>>(get(key), key, ValueType::FloatList);
}

std::string Config::to_toml() const {
  std::string out;
  for (const std::string& section : schema_->sections()) {
    if (schema_->keys_in_section(section).empty()) continue;  // a parent that only holds sections
    out += (out.empty() ? "[" : "\n[") + section + "]\n";
    for (const KeySpec& spec : schema_->keys()) {
      if (spec.section() != section) continue;
      std::stringstream help(spec.help);
      for (std::string line; std::getline(help, line);) out += "# " + line + "\n";
      out += spec.name() + " = " + format_value(get(spec.key)) + "\n";
    }
  }
  return out;
}

bool Config::is_default(const std::string& key) const {
  get(key);  // rejects unknown keys
  return set_values_.count(key) == 0;
}

std::vector<std::string> Config::explicitly_set_keys() const {
  std::vector<std::string> out;
  for (const KeySpec& spec : schema_->keys()) {
    if (set_values_.count(spec.key)) out.push_back(spec.key);
  }
  return out;
}

}  // namespace lockstep::train
