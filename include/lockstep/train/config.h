// Typed configuration for `lockstep train`: a schema of dotted keys ("train.batch_size") with
// types, defaults and limits, and a Config that resolves TOML files and "key=value" overrides
// against it. Every bad key or value is an InvalidArgument naming the key, where it came from and
// what would be valid. The TOML parser stays out of this header; see src/train/config.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lockstep/core/setting.h"

namespace lockstep::train {

// Value, ValueType, describe_type and Limits are core/setting.h's, shared with the quantizers' options.
// The value as TOML writes it: true, 64, 0.002, "fsq", [8, 5, 5, 5]. Doubles round-trip exactly.
std::string format_value(const Value& value);

// One key: its type, default and limits. Build with a factory and chain the limits, e.g.
// KeySpec::integer("train.batch_size", 64, "Images per step.").in_range(1, 65536).
// The key is dotted: the section path, then the name ("quantizer.fsq.levels").
struct KeySpec : SettingSpec {
  // For strings whose valid values are a pattern rather than a list: throws to refuse one.
  std::function<void(const std::string&)> check;
  std::string check_text;  // the pattern in words ("cpu, cuda or cuda:N")
  // A resumed run may change it: it alters neither the model nor the order of the data.
  bool resumable = false;
  // Each rank may set its own (where its data is, its threads, its device); the rest must agree.
  bool per_rank = false;
  // Command-line flags of `lockstep train` that set this key ("--batch-size" for train.batch_size).
  struct Shortcut {
    std::string flag;       // "--batch-size"
    std::string type_name;  // "INT", shown in --help
    std::string help;       // one line for --help
  };
  std::vector<Shortcut> shortcuts;

  static KeySpec boolean(std::string key, bool default_value, std::string help);
  static KeySpec integer(std::string key, int64_t default_value, std::string help);
  static KeySpec floating(std::string key, double default_value, std::string help);
  static KeySpec string(std::string key, std::string default_value, std::string help);
  static KeySpec int_list(std::string key, std::vector<int64_t> default_value, std::string help);
  static KeySpec float_list(std::string key, std::vector<double> default_value, std::string help);

  KeySpec& at_least(double lo);
  KeySpec& greater_than(double lo);
  KeySpec& at_most(double hi);
  KeySpec& less_than(double hi);
  KeySpec& in_range(double lo, double hi);
  KeySpec& one_of(std::vector<std::string> allowed);
  KeySpec& matching(std::string text, std::function<void(const std::string&)> check);
  KeySpec& length(size_t lo, size_t hi);
  KeySpec& may_change_on_resume();
  KeySpec& may_differ_per_rank();
  KeySpec& shortcut(std::string flag, std::string type_name, std::string help);

  std::string section() const;  // "quantizer.fsq" for "quantizer.fsq.levels"
  std::string name() const;     // "levels"
  // The limits in words ("in [1, 65536]", "one of: fsq", "1 to 5 elements, each in [1, 1024]"),
  // or "" when there are none.
  std::string constraint_text() const;
};

// The table of every key a Config accepts. Keys have at least one section ("train.lr"); sections
// nest ("quantizer.fsq"). A name cannot be both a key and a section.
class Schema {
 public:
  // Throws InvalidArgument for a malformed or duplicate key, or a default that breaks its limits.
  void add(KeySpec spec);

  const KeySpec* find(const std::string& key) const;          // nullptr when unknown
  const std::vector<KeySpec>& keys() const { return keys_; }  // in the order they were added
  bool is_section(const std::string& section) const;
  // Every section, parents included, in order of first appearance.
  std::vector<std::string> sections() const;
  // Names of the keys directly in `section`, sorted: "batch_size", "epochs", ...
  std::vector<std::string> keys_in_section(const std::string& section) const;
  // Names of the sections directly under `section` ("" for the top level), sorted.
  std::vector<std::string> subsections(const std::string& section) const;

 private:
  std::vector<KeySpec> keys_;
  std::map<std::string, size_t> index_;
};

// The keys of `lockstep train` (src/train/config_schema.cpp; documented in docs/configuration.md).
const Schema& lockstep_schema();

// Resolved values for one schema. Later sources override earlier ones: load the file, then apply
// overrides. Every setter is all-or-nothing: on error the Config is unchanged.
class Config {
 public:
  // Every key starts at its default. `schema` must outlive the Config.
  explicit Config(const Schema& schema);

  // Throws IoError when the file cannot be read; InvalidArgument for bad TOML, an unknown
  // key or a bad value, with the path and line.
  void load_toml_file(const std::string& path);
  // `origin` names the text in error messages, e.g. "resolved config run/config.toml".
  void load_toml_string(std::string_view text, const std::string& origin);
  // An integer is accepted for a float key; anything else must match the key's type.
  void set(const std::string& key, Value value);
  // "key=value" as given on the command line: train.lr=1e-3, train.batch_size=64,
  // data.dataset=fashion-mnist (quotes optional), model.channels=[32,64] or 32,64.
  void set_from_string(const std::string& assignment);

  const Value& get(const std::string& key) const;  // throws InvalidArgument for an unknown key
  // These also throw InvalidArgument when the key has another type.
  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<int64_t>& get_int_list(const std::string& key) const;
  const std::vector<double>& get_float_list(const std::string& key) const;

  // Every key with its resolved value, grouped by section, each under its help as a comment.
  // load_toml_string(to_toml()) reproduces every value exactly.
  std::string to_toml() const;
  // True when no source has set the key (it holds its default).
  bool is_default(const std::string& key) const;
  std::vector<std::string> explicitly_set_keys() const;  // in schema order
  const Schema& schema() const { return *schema_; }

 private:
  const Schema* schema_;
  std::map<std::string, Value> set_values_;  // only keys some source set
};

}  // namespace lockstep::train
