// Deeply nested outside input is refused before a parser recurses into it: these inputs crashed
// lockstep with a stack overflow (eval, encode and resume of such a checkpoint; train with such a
// config).
#include "lockstep/io/nesting.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "lockstep/core/error.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/train/config.h"

namespace lockstep::io {
namespace {

TEST(Nesting, CountsBracketsOutsideStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, [2, {"b": 3}]]})"), 4u);
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[[[\"[[["})"), 1u);
  EXPECT_EQ(json_nesting_depth("3"), 0u);
  EXPECT_EQ(toml_nesting_depth("[train]\nlr = 0.001 # a.b.c.d.e\nname = \"x.y.z.w.v\"\n"), 2u);
  EXPECT_EQ(toml_nesting_depth("a.b.c = [[1], [2]]"), 3u);
}

std::string safetensors_with_header(const std::string& header) {
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  return bytes + header;
}

TEST(Nesting, ASafetensorsHeaderNested100000DeepIsCorruptInput) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {
    decode_safetensors(safetensors_with_header(R"({"__metadata__": {"x": )" + deep + "}}"), "deep.safetensors");
    FAIL() << "accepted";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("deep.safetensors: safetensors header nests 100002 levels deep; at most 64"),
              std::string::npos)
        << e.what();
  }
}

TEST(Nesting, ATomlTableNameOf20000PartsIsRefused) {
  std::string name = "a";
  for (int i = 0; i < 20000; ++i) name += ".a";
  train::Config config(train::lockstep_schema());
  try {
    config.load_toml_string("[" + name + "]\nx = 1\n", "deep.toml");
    FAIL() << "accepted";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("deep.toml nests 20001 levels deep"), std::string::npos) << e.what();
  }
}

// JSON keeps the last of two equal keys; in a checkpoint that hides damage, so it is refused.
TEST(SafetensorsHeader, AKeyNamedTwiceInOneObjectIsCorruptInput) {
  try {
    decode_safetensors(safetensors_with_header(R"({"__metadata__": {"step": "10", "step": "99"}})"), "twice.st");
    FAIL() << "accepted";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("twice.st: safetensors header names 'step' twice"), std::string::npos)
        << e.what();
  }
  // The same key in two different objects (every tensor has a dtype) is fine.
  const std::string two_tensors =
      safetensors_with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                              R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})") +
      std::string(8, '\0');
  EXPECT_NO_THROW(decode_safetensors(two_tensors, "ok.st"));
}

}  // namespace
}  // namespace lockstep::io
