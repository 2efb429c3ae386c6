#include "lockstep/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"

namespace {

using lockstep::CorruptInput;
using lockstep::InvalidArgument;
using lockstep::io::decode_safetensors;
using lockstep::io::DType;
using lockstep::io::encode_safetensors;
using lockstep::io::RawTensor;
using lockstep::io::SafetensorsData;

const DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,
                            DType::I32, DType::I16, DType::I8,  DType::U8,   DType::Bool};

// Bytes that differ per position, so swapped or shifted tensors are caught.
RawTensor make_tensor(DType dtype, std::vector<int64_t> shape, int seed) {
  RawTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<std::size_t>(t.numel()) * lockstep::io::dtype_size(dtype));
  for (std::size_t i = 0; i < t.bytes.size(); ++i) {
    t.bytes[i] =
        static_cast<char>(dtype == DType::Bool ? (i + seed) % 2 : (i * 31 + static_cast<std::size_t>(seed) * 7) % 251);
  }
  return t;
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  return n;
}

std::string with_header(const std::string& json, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((json.size() >> (8 * i)) & 0xff));
  return out + json + data;
}

TEST(Safetensors, RoundTripsEveryDTypeAndShape) {
  SafetensorsData data;
  int seed = 0;
  for (DType dtype : kAllDTypes) {
    const std::string name = lockstep::io::dtype_name(dtype);
    data.tensors[name + "_scalar"] = make_tensor(dtype, {}, ++seed);
    data.tensors[name + "_empty"] = make_tensor(dtype, {0}, ++seed);
    data.tensors[name + "_empty3d"] = make_tensor(dtype, {2, 0, 3}, ++seed);
    data.tensors[name + "_matrix"] = make_tensor(dtype, {3, 5}, ++seed);
  }
  data.metadata = {{"format", "pt"}, {"step", "1200"}, {"note", "unicode \xc3\xa9 and \"quotes\""}};

  const std::string bytes = encode_safetensors(data);
  EXPECT_EQ(header_length(bytes) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  const SafetensorsData back = decode_safetensors(bytes, "mem");
  EXPECT_EQ(back.origin, "mem");
  EXPECT_EQ(back.metadata, data.metadata);
  ASSERT_EQ(back.tensors.size(), data.tensors.size());
  for (const auto& [name, t] : data.tensors) {
    const RawTensor& got = back.at(name);
    EXPECT_EQ(got.dtype, t.dtype) << name;
    EXPECT_EQ(got.shape, t.shape) << name;
    EXPECT_EQ(got.bytes, t.bytes) << name;
  }
}

TEST(Safetensors, HeaderListsTensorsInNameOrderWithContiguousOffsets) {
  SafetensorsData data;
  data.tensors["b"] = make_tensor(DType::F32, {2}, 1);
  data.tensors["a"] = make_tensor(DType::I16, {3}, 2);
  const std::string bytes = encode_safetensors(data);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_length(bytes)));
  EXPECT_FALSE(header.contains("__metadata__"));  // omitted when empty
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({0, 6}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({6, 14}));
  EXPECT_EQ(header["a"]["dtype"], "I16");
  EXPECT_EQ(header["b"]["shape"], nlohmann::json::array({2}));
  EXPECT_EQ(bytes.size(), 8 + header_length(bytes) + 14);
}

TEST(Safetensors, SavesAndLoadsFilesAtomically) {
  lockstep::test_util::TempDir dir;
  const std::string path = dir.file("model.safetensors");
  SafetensorsData data;
  data.tensors["w"] = make_tensor(DType::F32, {4, 4}, 3);
  data.metadata["epoch"] = "3";
  lockstep::io::save_safetensors(path, data);
  const SafetensorsData back = lockstep::io::load_safetensors(path);
  EXPECT_EQ(back.origin, path);
  EXPECT_EQ(back.at("w").bytes, data.tensors["w"].bytes);
  EXPECT_EQ(back.metadata, data.metadata);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});
  EXPECT_THROW(lockstep::io::load_safetensors(dir.file("missing.safetensors")), lockstep::IoError);
}

TEST(Safetensors, AtNamesMissingTensorOriginAndWhatIsPresent) {
  SafetensorsData data;
  data.tensors["encoder.w"] = make_tensor(DType::F32, {1}, 1);
  const SafetensorsData back = decode_safetensors(encode_safetensors(data), "ckpt.safetensors");
  try {
    back.at("decoder.w");
    FAIL() << "expected CorruptInput";
  } catch (const CorruptInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("decoder.w"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ckpt.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("encoder.w"), std::string::npos) << msg;
  }
}

TEST(Safetensors, EncodeRejectsInconsistentTensors) {
  SafetensorsData data;
  RawTensor t = make_tensor(DType::F32, {2, 2}, 1);
  t.bytes.pop_back();
  data.tensors["w"] = t;
  EXPECT_THROW(encode_safetensors(data), InvalidArgument);
  data.tensors.clear();
  data.tensors["__metadata__"] = make_tensor(DType::F32, {1}, 1);
  EXPECT_THROW(encode_safetensors(data), InvalidArgument);
  data.tensors.clear();
  data.tensors["neg"] = RawTensor{DType::F32, {-1}, ""};
  EXPECT_THROW(encode_safetensors(data), InvalidArgument);
}

struct CorruptCase {
  const char* name;
  std::string file;
  const char* expect;  // a fragment the message must contain besides the origin
};

std::vector<CorruptCase> corrupt_cases() {
  const std::string data8(8, '\x01');
  const auto tensor = [](const char* offsets, const char* shape = "[2]", const char* dtype = "\"F32\"") {
    return std::string("{\"dtype\":") + dtype + ",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
  };
  std::string huge_len = with_header("{}", "");
  huge_len[3] = 0x10;  // 0x10000000 + 2 bytes: 268 MB header length
  std::string past_end = with_header("{}", "");
  past_end[0] = 50;
  return {
      {"TooShort", std::string("\x02\x00\x00", 3), "fewer than the 8-byte"},
      {"HeaderLongerThanFile", past_end, "exceeds the 2 bytes"},
      {"HeaderOverLimit", huge_len, "exceeds the limit"},
      {"InvalidJson", with_header("{\"a\": [1,", data8), "not valid JSON"},
      {"NotAnObject", with_header("[1, 2]", data8), "not a JSON object"},
      {"EntryNotObject", with_header("{\"w\": 3}", ""), "'w': entry is not an object"},
      {"MissingDtype", with_header("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", data8), "missing field 'dtype'"},
      {"MissingShape", with_header("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", data8),
       "missing field 'shape'"},
      {"MissingOffsets", with_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", data8),
       "missing field 'data_offsets'"},
      {"UnknownField", with_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", data8),
       "unknown field 'x'"},
      {"DtypeNotString", with_header("{\"w\":" + tensor("[0,8]", "[2]", "4") + "}", data8), "dtype is not a string"},
      {"UnknownDtype", with_header("{\"w\":" + tensor("[0,8]", "[2]", "\"F128\"") + "}", data8), "'F128'"},
      {"ShapeNotArray", with_header("{\"w\":" + tensor("[0,8]", "2") + "}", data8), "shape is not an array"},
      {"NegativeDim", with_header("{\"w\":" + tensor("[0,8]", "[-2]") + "}", data8), "non-negative"},
      {"FractionalDim", with_header("{\"w\":" + tensor("[0,8]", "[2.5]") + "}", data8), "non-negative integers"},
      {"OffsetsNotPair", with_header("{\"w\":" + tensor("[0,4,8]") + "}", data8), "must be [begin, end]"},
      {"NegativeOffset", with_header("{\"w\":" + tensor("[-1,8]") + "}", data8), "must be [begin, end]"},
      {"BeginAfterEnd", with_header("{\"w\":" + tensor("[8,0]") + "}", data8), "begin > end"},
      {"EndPastData", with_header("{\"w\":" + tensor("[0,16]", "[4]") + "}", data8), "past the 8-byte data"},
      {"SizeMismatch", with_header("{\"w\":" + tensor("[0,8]", "[3]") + "}", data8), "needs 12"},
      {"ShapeOverflow", with_header("{\"w\":" + tensor("[0,8]", "[4294967296, 4294967296]") + "}", data8),
       "more than 2^63"},
      {"Overlap", with_header("{\"a\":" + tensor("[0,8]") + ",\"b\":" + tensor("[4,12]") + "}", data8 + "abcd"),
       "overlap"},
      {"EmptyInsideAnother", with_header("{\"a\":" + tensor("[0,8]") + ",\"z\":" + tensor("[4,4]", "[0]") + "}", data8),
       "overlap"},
      {"Gap", with_header("{\"a\":" + tensor("[0,8]") + ",\"b\":" + tensor("[12,20]") + "}", data8 + data8 + "gap!"),
       "gap of 4 bytes"},
      {"LeadingGap", with_header("{\"a\":" + tensor("[4,12]") + "}", "gap!" + data8), "gap of 4 bytes"},
      {"TrailingBytes", with_header("{\"a\":" + tensor("[0,8]") + "}", data8 + "xx"), "2 bytes at [8, 10)"},
      {"MetadataNotObject", with_header("{\"__metadata__\": [\"a\"]}", ""), "__metadata__ is not an object"},
      {"MetadataValueNotString", with_header("{\"__metadata__\": {\"step\": 12}}", ""), "'step' is not a string"},
  };
}

class SafetensorsCorrupt : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(SafetensorsCorrupt, ThrowsCorruptInputNamingOrigin) {
  const CorruptCase& c = GetParam();
  try {
    decode_safetensors(c.file, "/data/bad.safetensors");
    FAIL() << "expected CorruptInput";
  } catch (const CorruptInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("/data/bad.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "missing '" << c.expect << "' in: " << msg;
    EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << "the JSON library's tag in: " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(SafetensorsCorrupt, SafetensorsCorrupt, ::testing::ValuesIn(corrupt_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
