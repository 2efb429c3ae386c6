#include "lockstep/io/nesting.h"

#include <algorithm>

#include "lockstep/core/error.h"

namespace lockstep::io {

size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{')
      deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0)
      --depth;
  }
  return deepest;
}

size_t toml_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0, dots = 0;
  char quote = 0;  // '"' or '\'' inside a string
  bool escaped = false, comment = false;
  for (const char c : text) {
    if (c == '\n') {
      comment = false;
      dots = 0;
    }
    if (comment) continue;
    if (quote) {
      if (escaped)
        escaped = false;
      else if (c == '\\' && quote == '"')
        escaped = true;
      else if (c == quote)
        quote = 0;
      continue;
    }
    if (c == '"' || c == '\'')
      quote = c;
    else if (c == '#')
      comment = true;
    else if (c == '.')
      deepest = std::max(deepest, ++dots + 1);
    else if (c == '[' || c == '{')
      deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0)
      --depth;
  }
  return deepest;
}

void check_nesting(size_t depth, size_t limit, const std::string& origin) {
  LOCKSTEP_THROW_IF_NOT(depth <= limit, CorruptInput, origin, " nests ", depth, " levels deep; at most ", limit,
                        " are accepted (its parser would overflow the stack)");
}

}  // namespace lockstep::io
