// Every quantizer option, declared once: its key, default, limits and help. The defaults are the
// library's own (read from FsqOptions, LfqOptions, VqOptions, ResidualOptions), or, for what the
// library requires as a constructor argument (VQ's dim, FSQ's levels, ...), the value stated here.
// The configuration schema of `lockstep train` is assembled from these sections ("quantizer.vq.decay"),
// so the library and the CLI build the same quantizer from "the defaults". Free of torch headers.
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
