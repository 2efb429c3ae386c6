#include "lockstep/core/random.h"

#include <utility>

#include "lockstep/core/error.h"

namespace lockstep {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::below(uint64_t bound) {
  LOCKSTEP_CHECK_ARG(bound > 0, "SplitMix64::below: bound must be positive");
  __uint128_t m = static_cast<__uint128_t>(next()) * bound;
  auto low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<__uint128_t>(next()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b) {
  SplitMix64 g(seed);
  uint64_t s = g.next() ^ a;
  SplitMix64 g2(s);
  return g2.next() ^ (b * 0xD1B54A32D192ED03ULL);
}

std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  LOCKSTEP_CHECK_ARG(n >= 0, "permutation: n = ", n, " must be >= 0");
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 g(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(p[i], p[g.below(static_cast<uint64_t>(i) + 1)]);
  }
  return p;
}

}  // namespace lockstep
