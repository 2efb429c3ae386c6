// Every quantizer option, declared once: its key, default, limits and help. Most are a line of their
// options struct's field list (quant/*_options.def, option_fields.h), with the struct's default; the
// rest, here in option_specs.cpp, are what a struct takes otherwise: constructor arguments (VQ's dim,
// FSQ's levels, ...; their CLI default stated there), values with a meaning of their own (0 for "unset"),
// enums read from strings. The configuration schema of `lockstep train` is assembled from these sections
// ("quantizer.vq.decay"), so the library and the CLI build the same quantizer from "the defaults". Free of
// torch headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace lockstep::quant {

struct OptionSpec {
  enum class Type { Bool, Int, Float, IntList, String, FloatList };
  std::string key;  // within its section: "decay"
  Type type = Type::Int;
  std::variant<bool, int64_t, double, std::vector<int64_t>, std::string, std::vector<double>> default_value;
  std::string help;  // one line
  // Limits of a number, or of each element of a list; strict when the flag says so.
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;
  std::optional<size_t> min_len, max_len;  // lists
  std::vector<std::string> choices;        // strings: the values allowed
};

// The options of one section of the configuration: "fsq", "lfq", "vq", "residual", ... (the layers
// of the residual-* quantizers read the plain quantizer's section).
struct OptionSection {
  std::string name;
  std::vector<OptionSpec> options;
};

const std::vector<OptionSection>& quantizer_option_sections();

}  // namespace lockstep::quant
