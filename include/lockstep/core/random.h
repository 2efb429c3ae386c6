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

// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`, for counter-based random numbers
// keyed by (seed, position) that do not depend on how work is split.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A float in (0, 1), exact in float32, from the hash of (key, counter).
inline float hashed_uniform(uint64_t key, uint64_t counter) {
  return (static_cast<float>(mix64(key ^ mix64(counter)) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// A seed for an independent stream derived from (seed, a, b), e.g. (run seed, epoch, purpose).
uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b = 0);

// derive_seed's purposes, one per stream, all here so that no two streams coincide. A purpose with
// slots passes `purpose * 1000003 + slot`.
enum class SeedPurpose : uint64_t {
  Quantizer = 2,       // quantizer randomness: the trainer's micro-batches, the Python modules' steps
  BucketShuffle = 11,  // data plan: the order within each bucket (slot: the bucket)
  BatchOrder = 12,     // data plan: the order of the epoch's batches
  Replacement = 13,    // image folders: what replaces an unreadable image (slot: its place in the batch)
  Augmentation = 17,   // image folders: crops and flips (slot: the place in the batch)
};
constexpr uint64_t operator+(SeedPurpose p) { return static_cast<uint64_t>(p); }

// A permutation of [0, n) by Fisher-Yates driven by SplitMix64(seed).
std::vector<int64_t> permutation(int64_t n, uint64_t seed);

}  // namespace lockstep
