// Builds IDX files for tests: plain bytes, or gzip-compressed through zlib like the real datasets.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::test_util {

// An IDX byte string: magic 0 0 `type` ndim, big-endian u32 dims, then `payload`.
inline std::string make_idx(const std::vector<uint32_t>& dims, const std::string& payload, uint8_t type = 0x08) {
  std::string out{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  return out + payload;
}

// A payload whose bytes depend on their position, so reordering or truncation is visible.
inline std::string pattern(std::size_t n) {
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>((i * 13 + 5) % 256);
  return out;
}

inline void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << "cannot create " << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

}  // namespace lockstep::test_util
