#include "lockstep/io/npy.h"

#include <array>
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"

namespace lockstep::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;

struct NpyType {
  DType dtype;
  const char* descr;
};
constexpr std::array<NpyType, 9> kTypes{{{DType::F32, "<f4"},
                                         {DType::F64, "<f8"},
                                         {DType::F16, "<f2"},
                                         {DType::I64, "<i8"},
                                         {DType::I32, "<i4"},
                                         {DType::I16, "<i2"},
                                         {DType::I8, "|i1"},
                                         {DType::U8, "|u1"},
                                         {DType::Bool, "|b1"}}};

std::string valid_descrs() {
  std::string s;
  for (const auto& t : kTypes) s += (s.empty() ? "'" : ", '") + std::string(t.descr) + "'";
  return s;
}

DType dtype_from_descr(std::string descr, const std::string& origin) {
  // Byte order is meaningless for one-byte types; numpy writes '|' but accepts '<' and '='.
  if (descr.size() == 3 && descr[2] == '1' && (descr[0] == '<' || descr[0] == '=' || descr[0] == '>')) {
    descr[0] = '|';
  }
  for (const auto& t : kTypes) {
    if (descr == t.descr) return t.dtype;
  }
  LOCKSTEP_THROW_IF_NOT(descr.empty() || descr[0] != '>', CorruptInput, origin, ": .npy dtype '", descr,
                        "' is big-endian; only little-endian is supported");
  throw CorruptInput(
      detail::concat(origin, ": unsupported .npy dtype '", descr, "' (supported: ", valid_descrs(), ")"));
}

std::string shape_tuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// The header is a Python dict literal; this reads just the subset numpy writes
// (strings, True/False, tuples of integers) and reports anything else as corrupt.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& origin) : s_(text), origin_(origin) {}

  struct Value {
    std::optional<std::string> str;
    std::optional<bool> boolean;
    std::optional<std::vector<int64_t>> tuple;
  };

  std::map<std::string, Value> parse_dict() {
    std::map<std::string, Value> out;
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = parse_string();
      expect(':');
      out[key] = parse_value();
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      break;
    }
    expect('}');
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the dict");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CorruptInput(detail::concat(origin_, ": bad .npy header (", what, " at offset ", pos_, "): ", s_));
  }
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(detail::concat("expected '", c, "'"));
    ++pos_;
  }
  std::string parse_string() {
    skip_ws();
    char q = peek();
    if (q != '\'' && q != '"') fail("expected a string");
    std::size_t end = s_.find(q, pos_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string v = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return v;
  }
  bool take_word(const char* w) {
    std::string word(w);
    if (s_.compare(pos_, word.size(), word) != 0) return false;
    pos_ += word.size();
    return true;
  }
  int64_t parse_int() {
    skip_ws();
    std::size_t start = pos_;
    int64_t v = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s_[pos_] - '0', &v)) {
        fail("dimension too large");
      }
      ++pos_;
    }
    if (pos_ == start) fail("expected a non-negative integer");
    if (peek() == 'L') ++pos_;  // Python 2 long suffix in old files
    return v;
  }
  Value parse_value() {
    skip_ws();
    Value v;
    char c = peek();
    if (c == '\'' || c == '"') {
      v.str = parse_string();
    } else if (take_word("True")) {
      v.boolean = true;
    } else if (take_word("False")) {
      v.boolean = false;
    } else if (c == '(') {
      ++pos_;
      std::vector<int64_t> dims;
      while (true) {
        skip_ws();
        if (peek() == ')') break;
        dims.push_back(parse_int());
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        break;
      }
      expect(')');
      v.tuple = std::move(dims);
    } else {
      fail("unsupported value (structured dtypes are not supported)");
    }
    return v;
  }

  const std::string& s_;
  const std::string& origin_;
  std::size_t pos_ = 0;
};

uint32_t read_le(const std::string& b, std::size_t at, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace

std::string encode_npy(const RawTensor& tensor) {
  const NpyType* type = nullptr;
  for (const auto& t : kTypes) {
    if (t.dtype == tensor.dtype) type = &t;
  }
  LOCKSTEP_CHECK_ARG(type != nullptr, "dtype ", dtype_name(tensor.dtype),
                     " cannot be stored in .npy (numpy has no such type); convert it first");
  int64_t need = static_cast<int64_t>(dtype_size(tensor.dtype));
  for (int64_t d : tensor.shape) {
    LOCKSTEP_CHECK_ARG(d >= 0 && !__builtin_mul_overflow(need, d, &need), "invalid .npy shape ",
                       shape_tuple(tensor.shape));
  }
  LOCKSTEP_CHECK_ARG(static_cast<uint64_t>(need) == tensor.bytes.size(), "tensor of shape ", shape_tuple(tensor.shape),
                     " and dtype ", dtype_name(tensor.dtype), " needs ", need, " bytes but has ", tensor.bytes.size());

  std::string dict = detail::concat("{'descr': '", type->descr,
                                    "', 'fortran_order': False, 'shape': ", shape_tuple(tensor.shape), ", }");
  // Version 1.0 stores the header length in 2 bytes; longer headers (huge ndim) need 2.0's 4 bytes.
  std::size_t prefix = kMagicLen + 2 + 2;
  int major = 1;
  if (prefix + dict.size() + 1 > 65535) {
    prefix = kMagicLen + 2 + 4;
    major = 2;
  }
  // numpy pads with spaces and ends in '\n' so that the data starts 64-byte aligned.
  std::size_t total = prefix + dict.size() + 1;
  std::size_t pad = (64 - total % 64) % 64;
  std::string header = dict + std::string(pad, ' ') + "\n";

  std::string out(kMagic, kMagicLen);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const int len_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < len_bytes; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  out += header;
  out += tensor.bytes;
  return out;
}

RawTensor decode_npy(const std::string& bytes, const std::string& origin) {
  LOCKSTEP_THROW_IF_NOT(bytes.size() >= kMagicLen + 2 && bytes.compare(0, kMagicLen, kMagic, kMagicLen) == 0,
                        CorruptInput, origin, ": not a .npy file (bad magic)");
  const int major = static_cast<uint8_t>(bytes[kMagicLen]);
  LOCKSTEP_THROW_IF_NOT(major >= 1 && major <= 3, CorruptInput, origin, ": unsupported .npy version ", major, ".",
                        static_cast<int>(static_cast<uint8_t>(bytes[kMagicLen + 1])), " (supported: 1, 2, 3)");
  const int len_bytes = major == 1 ? 2 : 4;
  const std::size_t header_at = kMagicLen + 2 + static_cast<std::size_t>(len_bytes);
  LOCKSTEP_THROW_IF_NOT(bytes.size() >= header_at, CorruptInput, origin, ": .npy file truncated in its header");
  const std::size_t header_len = read_le(bytes, kMagicLen + 2, len_bytes);
  LOCKSTEP_THROW_IF_NOT(header_len <= bytes.size() - header_at, CorruptInput, origin, ": .npy header length ",
                        header_len, " exceeds the ", bytes.size() - header_at, " bytes that follow");

  const std::string text = bytes.substr(header_at, header_len);
  auto dict = HeaderParser(text, origin).parse_dict();
  for (const auto& [key, value] : dict) {
    LOCKSTEP_THROW_IF_NOT(key == "descr" || key == "fortran_order" || key == "shape", CorruptInput, origin,
                          ": unexpected .npy header key '", key, "' in ", text);
  }
  LOCKSTEP_THROW_IF_NOT(dict.count("descr") && dict["descr"].str, CorruptInput, origin,
                        ": .npy header lacks a string 'descr': ", text);
  LOCKSTEP_THROW_IF_NOT(dict.count("fortran_order") && dict["fortran_order"].boolean, CorruptInput, origin,
                        ": .npy header lacks a boolean 'fortran_order': ", text);
  LOCKSTEP_THROW_IF_NOT(dict.count("shape") && dict["shape"].tuple, CorruptInput, origin,
                        ": .npy header lacks a tuple 'shape': ", text);
  LOCKSTEP_THROW_IF_NOT(!*dict["fortran_order"].boolean, CorruptInput, origin,
                        ": .npy array is in Fortran order; only C order is supported (save a C-contiguous copy)");

  RawTensor t;
  t.dtype = dtype_from_descr(*dict["descr"].str, origin);
  t.shape = *dict["shape"].tuple;
  int64_t need = static_cast<int64_t>(dtype_size(t.dtype));
  for (int64_t d : t.shape) {
    LOCKSTEP_THROW_IF_NOT(!__builtin_mul_overflow(need, d, &need), CorruptInput, origin, ": .npy shape ",
                          shape_tuple(t.shape), " overflows");
  }
  const std::size_t data_at = header_at + header_len;
  const std::size_t have = bytes.size() - data_at;
  LOCKSTEP_THROW_IF_NOT(have == static_cast<uint64_t>(need), CorruptInput, origin, ": .npy data has ", have,
                        " bytes but shape ", shape_tuple(t.shape), " of '", *dict["descr"].str, "' needs ", need,
                        have < static_cast<uint64_t>(need) ? " (truncated)" : " (trailing bytes)");
  t.bytes = bytes.substr(data_at);
  return t;
}

void save_npy(const std::string& path, const RawTensor& tensor) { write_file_atomic(path, encode_npy(tensor)); }

RawTensor load_npy(const std::string& path) { return decode_npy(read_file(path), path); }

}  // namespace lockstep::io
