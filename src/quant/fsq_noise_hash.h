// The counter-based hash behind FSQ's noise dropout, shared by the fused kernel and the torch-op
// path, so that both give the same elements the same noise. Internal to src/quant.
#pragma once

#include <cstdint>

// Always inlined, so that each of the fused CPU kernel's target clones compiles it for its own
// instruction set; under nvcc also a device function (src/quant/cuda/fsq.cu).
#ifdef __CUDACC__
#define LOCKSTEP_FSQ_HASH_INLINE __host__ __device__ __forceinline__
#else
#define LOCKSTEP_FSQ_HASH_INLINE inline __attribute__((always_inline))
#endif

namespace lockstep::quant::detail {

// murmur3's finaliser.
LOCKSTEP_FSQ_HASH_INLINE uint32_t fsq_mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// The two keys of a run of elements whose first is global element `first`.
struct FsqNoiseKeys {
  uint32_t key0, key1;
};
LOCKSTEP_FSQ_HASH_INLINE FsqNoiseKeys fsq_noise_keys(uint64_t seed, int64_t first) {
  return {fsq_mix32(static_cast<uint32_t>(seed) ^ fsq_mix32(static_cast<uint32_t>(first >> 32))),
          fsq_mix32(static_cast<uint32_t>(seed >> 32) + 0x9e3779b9u)};
}

}  // namespace lockstep::quant::detail
