// Text helpers of the configuration (see config_text.h), and format_value.
#include "config_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <variant>

namespace lockstep::train {
namespace config_text {

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

std::string trim(std::string_view s) {
  const char* space = " \t\r\n";
  size_t begin = s.find_first_not_of(space);
  if (begin == std::string_view::npos) return "";
  return std::string(s.substr(begin, s.find_last_not_of(space) - begin + 1));
}

std::string parent_of(const std::string& dotted) {
  size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? "" : dotted.substr(0, dot);
}

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest text that reads back as the same double.
  std::string s(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";  // TOML would read "2" as an integer
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

bool is_bare_key(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

}  // namespace config_text

using namespace config_text;

std::string format_value(const Value& value) {
  struct Formatter {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return format_double(d); }
    std::string operator()(const std::string& s) const { return quote(s); }
    std::string operator()(const std::vector<int64_t>& v) const {
      return format_list(v, [](int64_t i) { return std::to_string(i); });
    }
    std::string operator()(const std::vector<double>& v) const { return format_list(v, format_double); }
  };
  return std::visit(Formatter{}, value);
}

}  // namespace lockstep::train
