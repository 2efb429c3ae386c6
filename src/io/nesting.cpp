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

namespace {

// Calls `code(offset, c)` for every byte of TOML text outside strings (basic, literal, and their
// multi-line forms) and comments: the bytes that make up keys, values and structure.
template <typename F>
void for_each_code_byte(std::string_view text, F code) {
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '#') {
      while (i + 1 < n && text[i + 1] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const bool multi_line = text.substr(i, 3) == std::string(3, c);
      const size_t open = multi_line ? 3 : 1;
      for (i += open; i < n; ++i) {
        if (text[i] == '\\' && c == '"') {
          ++i;  // the escaped byte
        } else if (!multi_line && text[i] == '\n') {
          --i;  // an unterminated single-line string (the parser says so); the line ends here
          break;
        } else if (text[i] == c && (!multi_line || text.substr(i, 3) == std::string(3, c))) {
          i += open - 1;
          // A multi-line string may end in up to two more quotes of its kind ("""a"""").
          while (multi_line && i + 1 < n && text[i + 1] == c) ++i;
          break;
        }
      }
    } else {
      code(i, c);
    }
  }
}

}  // namespace

size_t toml_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0, dots = 0;
  for_each_code_byte(text, [&](size_t, char c) {
    if (c == '\n')
      dots = 0;
    else if (c == '.')
      deepest = std::max(deepest, ++dots + 1);
    else if (c == '[' || c == '{')
      deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0)
      --depth;
  });
  return deepest;
}

void check_nesting(size_t depth, size_t limit, const std::string& origin) {
  LOCKSTEP_THROW_IF_NOT(depth <= limit, CorruptInput, origin, " nests ", depth, " levels deep; at most ", limit,
                        " are accepted (its parser would overflow the stack)");
}

}  // namespace lockstep::io
