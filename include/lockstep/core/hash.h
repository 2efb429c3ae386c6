// FNV-1a, 64 bits: the one checksum lockstep uses to compare things between ranks and runs
// (collective fingerprints, data plans, manifests, replicas). Not cryptographic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep {

constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;

// Continues hash `h` over `size` bytes at `data`.
inline uint64_t fnv1a(const void* data, size_t size, uint64_t h = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

// Continues `h` over v's 8 bytes, least significant first on every host (pinned hashes stay put).
inline uint64_t fnv1a_int64(int64_t v, uint64_t h) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) h = (h ^ ((u >> (8 * i)) & 0xff)) * 0x100000001b3ULL;
  return h;
}

}  // namespace lockstep
