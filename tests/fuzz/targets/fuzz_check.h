// What every fuzz target shares: the input as a string, and a check that stops the run (libFuzzer
// then saves the input as a crash) when a property of the parser does not hold.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

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

}  // namespace lockstep::fuzz
