// UTF-8 checks for text that ends up in JSON or TOML (file names in a manifest, config strings):
// both formats require well-formed UTF-8, and a writer that emits anything else makes a file its
// own reader refuses.
#pragma once

#include <string>
#include <string_view>

namespace lockstep {

// Whether `s` is well-formed UTF-8: no overlong forms, surrogates or values past U+10FFFF.
bool is_utf8(std::string_view s);

// `s` with every byte outside printable ASCII, and the backslash, written as \xNN: a name that is
// not UTF-8, shown ("caf\xe9.png").
std::string escape_bytes(std::string_view s);

}  // namespace lockstep
