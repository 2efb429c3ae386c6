// Bounds on how deeply outside text nests, checked before a parser sees it: JSON and TOML parsers
// and serialisers recurse once per level, so 100,000 nested arrays (or a table name of 20,000
// dotted parts) overflow the stack, a crash no exception can report.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep::io {

// Deepest nesting of [ ] and { } in JSON text, outside strings.
size_t json_nesting_depth(std::string_view text);

// The larger of the deepest [ ] / { } nesting and the most dot-separated parts on one line, outside
// strings and comments (a dotted key or table name nests one table per part).
size_t toml_nesting_depth(std::string_view text);

// Throws CorruptInput naming `origin`, the depth found and the limit when `depth` exceeds `limit`.
void check_nesting(size_t depth, size_t limit, const std::string& origin);

constexpr size_t kMaxJsonNesting = 64;
constexpr size_t kMaxTomlNesting = 32;

}  // namespace lockstep::io
