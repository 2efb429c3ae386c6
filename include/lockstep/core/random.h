// A small portable random generator whose output is the same on every platform and standard
// library (std::shuffle and std distributions are not), for data plans that every rank and every
// resumed run must reproduce exactly.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep {

// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state advanced by a constant, then mixed.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [0, bound) without modulo bias (Lemire's method with rejection); bound > 0.
  uint64_t below(uint64_t bound);

 private:
  uint64_t state_;
};

// A seed for an independent stream derived from (seed, a, b), e.g. (run seed, epoch, purpose).
uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b = 0);

// A permutation of [0, n) by Fisher-Yates driven by SplitMix64(seed).
std::vector<int64_t> permutation(int64_t n, uint64_t seed);

}  // namespace lockstep
