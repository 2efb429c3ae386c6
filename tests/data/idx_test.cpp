#include "lockstep/data/idx.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/idx_writer.h"
#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"

namespace {

using lockstep::CorruptInput;
using lockstep::data::parse_idx;
using lockstep::data::read_idx;
using lockstep::test_util::make_idx;
using lockstep::test_util::pattern;
using lockstep::test_util::TempDir;
using lockstep::test_util::write_bytes;
using lockstep::test_util::write_gzip;

std::string message_of(const std::string& path) {
  try {
    read_idx(path);
  } catch (const CorruptInput& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected CorruptInput for " << path;
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "missing '" << (needle) << "' in: " << (haystack)

TEST(Idx, ReadsPlainAndGzipFilesAlike) {
  TempDir dir;
  const std::string payload = pattern(60);
  write_bytes(dir.file("a.idx"), make_idx({3, 4, 5}, payload));
  write_gzip(dir.file("a.idx.gz"), make_idx({3, 4, 5}, payload));
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    const auto arr = read_idx(dir.file(name));
    EXPECT_EQ(arr.dims, (std::vector<int64_t>{3, 4, 5})) << name;
    EXPECT_EQ(std::string(arr.data.begin(), arr.data.end()), payload) << name;
  }
}

// Big dims exercise the big-endian decoding of every byte, and a payload over one inflate chunk.
TEST(Idx, DecodesBigEndianDimsAndLargePayloads) {
  TempDir dir;
  const std::string payload = pattern(210000);
  write_gzip(dir.file("big.gz"), make_idx({70000, 3}, payload));
  const auto arr = read_idx(dir.file("big.gz"));
  EXPECT_EQ(arr.dims, (std::vector<int64_t>{70000, 3}));
  EXPECT_EQ(std::string(arr.data.begin(), arr.data.end()), payload);
  EXPECT_EQ(parse_idx(make_idx({1}, "x"), "one").dims, (std::vector<int64_t>{1}));
}

TEST(Idx, ConcatenatedGzipMembersAreOneStream) {
  TempDir dir;
  const std::string file = make_idx({2, 8}, pattern(16));
  write_gzip(dir.file("p1.gz"), file.substr(0, 10));
  write_gzip(dir.file("p2.gz"), file.substr(10));
  const std::string joined = lockstep::io::read_file(dir.file("p1.gz")) + lockstep::io::read_file(dir.file("p2.gz"));
  write_bytes(dir.file("joined.gz"), joined);
  EXPECT_EQ(read_idx(dir.file("joined.gz")).data.size(), 16u);
}

TEST(Idx, RejectsWrongMagicAndUnsupportedTypes) {
  TempDir dir;
  write_bytes(dir.file("magic"), std::string("\x1f\x00\x08\x01\x00\x00\x00\x01x", 9));
  EXPECT_CONTAINS(message_of(dir.file("magic")), "not an IDX file");
  write_bytes(dir.file("float"), make_idx({2}, std::string(8, '\0'), 0x0D));
  const std::string msg = message_of(dir.file("float"));
  EXPECT_CONTAINS(msg, dir.file("float"));
  EXPECT_CONTAINS(msg, "0x0d (float)");
  EXPECT_CONTAINS(msg, "0x08 (unsigned byte)");
}

TEST(Idx, RejectsBadDimensions) {
  EXPECT_THROW(parse_idx(make_idx({}, ""), "x"), CorruptInput);
  EXPECT_THROW(parse_idx(make_idx({1, 1, 1, 1, 1}, "x"), "x"), CorruptInput);
  try {
    parse_idx(make_idx({5, 0, 3}, ""), "zero.idx");
    FAIL() << "expected CorruptInput";
  } catch (const CorruptInput& e) {
    EXPECT_CONTAINS(e.what(), "zero.idx: IDX dimension 1 is zero");
  }
  // 2^32-1 cubed overflows 64 bits; both must be refused before any allocation.
  EXPECT_THROW(parse_idx(make_idx({0xffffffffu, 0xffffffffu, 0xffffffffu}, ""), "x"), CorruptInput);
  EXPECT_THROW(parse_idx(make_idx({100000, 100000, 2}, ""), "x"), CorruptInput);
  EXPECT_THROW(parse_idx(make_idx({3, 4}, "").substr(0, 9), "x"), CorruptInput);  // header cut short
}

TEST(Idx, RejectsShortOrLongPayloadsWithByteCounts) {
  TempDir dir;
  write_bytes(dir.file("short"), make_idx({4, 5}, pattern(17)));
  std::string msg = message_of(dir.file("short"));
  EXPECT_CONTAINS(msg, "17 bytes");
  EXPECT_CONTAINS(msg, "need 20");
  EXPECT_CONTAINS(msg, "truncated");
  write_bytes(dir.file("long"), make_idx({4, 5}, pattern(21)));
  EXPECT_CONTAINS(message_of(dir.file("long")), "trailing");
  write_gzip(dir.file("long.gz"), make_idx({4, 5}, pattern(200000)));
  EXPECT_CONTAINS(message_of(dir.file("long.gz")), "trailing");
  write_gzip(dir.file("short.gz"), make_idx({4, 5}, pattern(3)));
  EXPECT_CONTAINS(message_of(dir.file("short.gz")), "truncated");
}

TEST(Idx, CorruptOrTruncatedGzipSaysSo) {
  TempDir dir;
  write_gzip(dir.file("ok.gz"), make_idx({100, 10}, pattern(1000)));
  const std::string gz = lockstep::io::read_file(dir.file("ok.gz"));
  std::string bad = gz;
  bad[10] = static_cast<char>(0xff);  // first deflate block header: reserved block type
  write_bytes(dir.file("bad.gz"), bad);
  std::string msg = message_of(dir.file("bad.gz"));
  EXPECT_CONTAINS(msg, dir.file("bad.gz"));
  EXPECT_CONTAINS(msg, "corrupt gzip");
  write_bytes(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  msg = message_of(dir.file("cut.gz"));
  EXPECT_CONTAINS(msg, dir.file("cut.gz"));
  EXPECT_CONTAINS(msg, "corrupt gzip");
  std::string crc = gz;
  crc[crc.size() - 6] ^= 0x55;  // CRC-32 in the trailer
  write_bytes(dir.file("crc.gz"), crc);
  EXPECT_CONTAINS(message_of(dir.file("crc.gz")), "corrupt gzip");
}

TEST(Idx, MissingFileIsAnIoError) {
  TempDir dir;
  EXPECT_THROW(read_idx(dir.file("missing.gz")), lockstep::IoError);
}

}  // namespace
