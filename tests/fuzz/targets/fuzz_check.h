// What every fuzz target shares: the input as a string, and a check that stops the run (libFuzzer
// then saves the input as a crash) when a property of the parser does not hold.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "lockstep/core/error.h"

namespace lockstep::fuzz {

inline std::string input(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

inline void require(bool holds, const char* property) {
  if (!holds) {
    std::fprintf(stderr, "fuzz property broken: %s\n", property);
    std::abort();
  }
}

// What `parse` returns, or nothing when it refused the input with CorruptInput: the one outcome a
// parser of outside input may have besides a result (anything else escapes and is a finding).
template <typename Parse>
auto unless_refused(Parse parse) -> std::optional<decltype(parse())> {
  try {
    return parse();
  } catch (const CorruptInput&) {
    return std::nullopt;
  }
}

}  // namespace lockstep::fuzz
