#include "lockstep/io/npy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"

namespace {

using lockstep::CorruptInput;
using lockstep::io::decode_npy;
using lockstep::io::DType;
using lockstep::io::encode_npy;
using lockstep::io::RawTensor;

RawTensor make_tensor(DType dtype, std::vector<int64_t> shape) {
  RawTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<std::size_t>(t.numel()) * lockstep::io::dtype_size(dtype));
  for (std::size_t i = 0; i < t.bytes.size(); ++i) {
    t.bytes[i] = static_cast<char>(dtype == DType::Bool ? i % 2 : (i * 37 + 11) % 253);
  }
  return t;
}

// A .npy file with the given version and header text, padded the way numpy pads it.
std::string npy_file(int major, std::string header, const std::string& data) {
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  const std::size_t prefix = 8 + len_bytes;
  header += std::string((64 - (prefix + header.size() + 1) % 64) % 64, ' ') + "\n";
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  for (std::size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

struct TypeCase {
  DType dtype;
  const char* descr;
};
const TypeCase kTypes[] = {{DType::F32, "<f4"}, {DType::F64, "<f8"}, {DType::F16, "<f2"},
                           {DType::I64, "<i8"}, {DType::I32, "<i4"}, {DType::I16, "<i2"},
                           {DType::I8, "|i1"},  {DType::U8, "|u1"},  {DType::Bool, "|b1"}};

TEST(Npy, RoundTripsEveryDTypeAndShape) {
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {5}, {2, 3}, {2, 0, 4}, {1, 2, 1, 3}};
  for (const TypeCase& tc : kTypes) {
    for (const auto& shape : shapes) {
      const RawTensor t = make_tensor(tc.dtype, shape);
      const std::string bytes = encode_npy(t);
      const RawTensor back = decode_npy(bytes, "mem.npy");
      EXPECT_EQ(back.dtype, t.dtype) << tc.descr;
      EXPECT_EQ(back.shape, t.shape) << tc.descr;
      EXPECT_EQ(back.bytes, t.bytes) << tc.descr;
      EXPECT_NE(bytes.find(std::string("'descr': '") + tc.descr + "'"), std::string::npos) << bytes.substr(0, 64);
    }
  }
}

// The exact bytes numpy 1.x writes for np.zeros((2, 3), '<f4'): header padded to 64 bytes.
TEST(Npy, HeaderMatchesNumpyLayout) {
  const std::string bytes = encode_npy(make_tensor(DType::F32, {2, 3}));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_GE(bytes.size(), 64u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8), 118);
  EXPECT_EQ(bytes.substr(10, dict.size()), dict);
  EXPECT_EQ(bytes[127], '\n');
  EXPECT_EQ(bytes.size(), 128u + 24u);
  EXPECT_NE(encode_npy(make_tensor(DType::U8, {7})).find("'shape': (7,), }"), std::string::npos);
  EXPECT_NE(encode_npy(make_tensor(DType::U8, {})).find("'shape': (), }"), std::string::npos);
}

TEST(Npy, UsesVersion2WhenTheHeaderExceeds64KiB) {
  const RawTensor t = make_tensor(DType::I16, std::vector<int64_t>(30000, 1));
  const std::string bytes = encode_npy(t);
  EXPECT_EQ(bytes[6], '\x02');
  const uint32_t len =
      static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8) | (static_cast<uint8_t>(bytes[10]) << 16);
  EXPECT_EQ((12 + len) % 64, 0u);
  const RawTensor back = decode_npy(bytes, "big.npy");
  EXPECT_EQ(back.shape, t.shape);
  EXPECT_EQ(back.bytes, t.bytes);
}

TEST(Npy, ReadsVariantsOtherWritersProduce) {
  const std::string four(4, '\x07');
  // Version 3 (UTF-8 header), double quotes, reordered keys, no trailing comma.
  RawTensor t =
      decode_npy(npy_file(3, "{\"shape\": (2, 2), \"fortran_order\": False, \"descr\": \"|u1\"}", four), "v3");
  EXPECT_EQ(t.dtype, DType::U8);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 2}));
  // Version 2, Python 2 long suffixes, '<u1' for a one-byte type.
  t = decode_npy(npy_file(2, "{'descr': '<u1', 'fortran_order': False, 'shape': (4L,), }", four), "v2");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(t.bytes, four);
}

TEST(Npy, BFloat16CannotBeSaved) { EXPECT_THROW(encode_npy(make_tensor(DType::BF16, {2})), lockstep::InvalidArgument); }

TEST(Npy, SaveAndLoadFile) {
  lockstep::test_util::TempDir dir;
  const RawTensor t = make_tensor(DType::F64, {3, 2});
  lockstep::io::save_npy(dir.file("a.npy"), t);
  EXPECT_EQ(lockstep::io::load_npy(dir.file("a.npy")).bytes, t.bytes);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"a.npy"});
  EXPECT_THROW(lockstep::io::load_npy(dir.file("missing.npy")), lockstep::IoError);
}

struct NpyCorruptCase {
  const char* name;
  std::string file;
  const char* expect;
};

std::vector<NpyCorruptCase> npy_corrupt_cases() {
  const std::string f8(8, '\0');
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  std::string long_header = npy_file(1, good, f8);
  long_header[8] = '\xff';
  long_header[9] = '\x7f';
  return {
      {"BadMagic", std::string("\x93NUMPX\x01\x00", 8) + npy_file(1, good, f8).substr(8), "bad magic"},
      {"Empty", "", "bad magic"},
      {"Version4",
       [&] {
         auto f = npy_file(1, good, f8);
         f[6] = 4;
         return f;
       }(),
       "version 4.0"},
      {"HeaderPastEnd", long_header, "header length 32767"},
      {"FortranOrder", npy_file(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", f8), "Fortran"},
      {"BigEndian", npy_file(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f8), "big-endian"},
      {"Complex", npy_file(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", f8), "'<c8'"},
      {"Structured", npy_file(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", f8),
       "structured"},
      {"Truncated", npy_file(1, good, f8.substr(0, 5)), "5 bytes"},
      {"TrailingBytes", npy_file(1, good, f8 + "x"), "trailing"},
      {"MissingShape", npy_file(1, "{'descr': '<f4', 'fortran_order': False, }", f8), "'shape'"},
      {"ExtraKey", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': True}", f8), "'x'"},
      {"NegativeDim", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", f8), "non-negative"},
      {"Unterminated", npy_file(1, "{'descr': '<f4", f8), "unterminated"},
      {"HugeDim", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", f8),
       "too large"},
  };
}

class NpyCorrupt : public ::testing::TestWithParam<NpyCorruptCase> {};

TEST_P(NpyCorrupt, ThrowsCorruptInputNamingOrigin) {
  const NpyCorruptCase& c = GetParam();
  try {
    decode_npy(c.file, "/data/bad.npy");
    FAIL() << "expected CorruptInput";
  } catch (const CorruptInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("/data/bad.npy"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "missing '" << c.expect << "' in: " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(NpyCorrupt, NpyCorrupt, ::testing::ValuesIn(npy_corrupt_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
