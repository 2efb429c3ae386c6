#include "lockstep/io/safetensors.h"
#include "lockstep/io/json_error.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/io/nesting.h"

namespace lockstep::io {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// A header this large is a corrupt length field, not a real file (the reference reader uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t read_u64_le(const std::string& bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[static_cast<std::size_t>(i)]);
  return v;
}

void append_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// numel * dtype size, or -1 when it overflows int64.
int64_t checked_nbytes(const std::vector<int64_t>& shape, std::size_t elem) {
  int64_t n = static_cast<int64_t>(elem);
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

struct Entry {
  std::string name;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// One tensor entry of the header, validated against the data section's size.
RawTensor parse_tensor(const std::string& name, const json& info, const std::string& origin, uint64_t data_size,
                       Entry& entry) {
  const std::string where = detail::concat(origin, ": safetensors tensor '", name, "'");
  LOCKSTEP_THROW_IF_NOT(info.is_object(), CorruptInput, where, ": entry is not an object: ", info.dump());
  for (const auto& item : info.items()) {
    const std::string& key = item.key();
    LOCKSTEP_THROW_IF_NOT(key == "dtype" || key == "shape" || key == "data_offsets", CorruptInput, where,
                          ": unknown field '", key, "' (valid: dtype, shape, data_offsets)");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    LOCKSTEP_THROW_IF_NOT(info.contains(key), CorruptInput, where, ": missing field '", key, "'");
  }
  const json& dtype = info["dtype"];
  LOCKSTEP_THROW_IF_NOT(dtype.is_string(), CorruptInput, where, ": dtype is not a string: ", dtype.dump());
  RawTensor t;
  t.dtype = dtype_from_name(dtype.get<std::string>(), where);

  const json& shape = info["shape"];
  LOCKSTEP_THROW_IF_NOT(shape.is_array(), CorruptInput, where, ": shape is not an array: ", shape.dump());
  for (const json& d : shape) {
    // nlohmann parses every non-negative integer as unsigned, so this also rejects negatives.
    LOCKSTEP_THROW_IF_NOT(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), CorruptInput,
                          where, ": shape ", shape.dump(), " must hold non-negative integers");
    t.shape.push_back(d.get<int64_t>());
  }

  const json& offsets = info["data_offsets"];
  LOCKSTEP_THROW_IF_NOT(
      offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(),
      CorruptInput, where, ": data_offsets ", offsets.dump(), " must be [begin, end] with non-negative integers");
  entry.name = name;
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  LOCKSTEP_THROW_IF_NOT(entry.begin <= entry.end, CorruptInput, where, ": data_offsets [", entry.begin, ", ", entry.end,
                        "] have begin > end");
  LOCKSTEP_THROW_IF_NOT(entry.end <= data_size, CorruptInput, where, ": data_offsets [", entry.begin, ", ", entry.end,
                        "] run past the ", data_size, "-byte data section");

  const int64_t need = checked_nbytes(t.shape, dtype_size(t.dtype));
  LOCKSTEP_THROW_IF_NOT(need >= 0 && static_cast<uint64_t>(need) == entry.end - entry.begin, CorruptInput, where,
                        ": data_offsets [", entry.begin, ", ", entry.end, "] hold ", entry.end - entry.begin,
                        " bytes but shape ", shape_text(t.shape), " of ", dtype_name(t.dtype), " needs ",
                        need < 0 ? std::string("more than 2^63") : std::to_string(need));
  return t;
}

// The format requires the tensors to tile the data section exactly: no overlap, no hole, no tail.
void check_coverage(std::vector<Entry> entries, uint64_t data_size, const std::string& origin) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    LOCKSTEP_THROW_IF_NOT(e.begin >= pos, CorruptInput, origin, ": safetensors tensors '", prev ? prev->name : "",
                          "' [", prev ? prev->begin : 0, ", ", pos, ") and '", e.name, "' [", e.begin, ", ", e.end,
                          ") overlap");
    LOCKSTEP_THROW_IF_NOT(e.begin == pos, CorruptInput, origin, ": safetensors data has a gap of ", e.begin - pos,
                          " bytes at [", pos, ", ", e.begin, ") before tensor '", e.name, "'");
    pos = e.end;
    prev = &e;
  }
  LOCKSTEP_THROW_IF_NOT(pos == data_size, CorruptInput, origin, ": safetensors data section has ", data_size - pos,
                        " bytes at [", pos, ", ", data_size, ") that no tensor covers");
}

}  // namespace

const RawTensor& SafetensorsData::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  std::string present;
  for (const auto& [n, t] : tensors) present += (present.empty() ? "" : ", ") + n;
  throw CorruptInput(detail::concat(origin.empty() ? std::string("safetensors data") : origin, ": no tensor '", name,
                                    "' (present: ", present.empty() ? std::string("none") : present, ")"));
}

std::string encode_safetensors(const SafetensorsData& data) {
  ordered_json header = ordered_json::object();
  if (!data.metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : data.metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : data.tensors) {
    LOCKSTEP_CHECK_ARG(name != kMetadataKey, "a tensor may not be called '", kMetadataKey, "'");
    const int64_t need = checked_nbytes(t.shape, dtype_size(t.dtype));
    LOCKSTEP_CHECK_ARG(std::all_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d >= 0; }) && need >= 0 &&
                           static_cast<uint64_t>(need) == t.bytes.size(),
                       "tensor '", name, "' has shape ", shape_text(t.shape), " of ", dtype_name(t.dtype), " but ",
                       t.bytes.size(), " bytes");
    header[name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const ordered_json::exception& e) {
    throw InvalidArgument(
        detail::concat("cannot encode safetensors header (names and metadata must be UTF-8): ", json_error_text(e)));
  }
  // Spaces after the JSON keep the data section 8-byte aligned, as the format recommends.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + offset);
  append_u64_le(out, text.size());
  out += text;
  for (const auto& [name, t] : data.tensors) out += t.bytes;
  return out;
}

SafetensorsData decode_safetensors(const std::string& bytes, const std::string& origin) {
  LOCKSTEP_THROW_IF_NOT(bytes.size() >= 8, CorruptInput, origin, ": safetensors file has ", bytes.size(),
                        " bytes, fewer than the 8-byte header length");
  const uint64_t n = read_u64_le(bytes);
  LOCKSTEP_THROW_IF_NOT(n <= kMaxHeaderBytes, CorruptInput, origin, ": safetensors header length ", n,
                        " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  LOCKSTEP_THROW_IF_NOT(n <= bytes.size() - 8, CorruptInput, origin, ": safetensors header length ", n, " exceeds the ",
                        bytes.size() - 8, " bytes after the length field");

  const std::string_view header_text(bytes.data() + 8, static_cast<size_t>(n));
  check_nesting(json_nesting_depth(header_text), kMaxJsonNesting, origin + ": safetensors header");
  json header;
  // JSON lets a key repeat and the parser keeps the last; a checkpoint whose step or tensor is
  // written twice is damaged, so repeats are found while parsing and refused.
  std::vector<std::set<std::string>> keys_per_object;
  std::string repeated;
  const json::parser_callback_t watch_keys = [&](int, json::parse_event_t event, json& value) {
    if (event == json::parse_event_t::object_start) keys_per_object.emplace_back();
    if (event == json::parse_event_t::object_end && !keys_per_object.empty()) keys_per_object.pop_back();
    if (event == json::parse_event_t::key && !keys_per_object.empty() && repeated.empty() &&
        !keys_per_object.back().insert(value.get<std::string>()).second) {
      repeated = value.get<std::string>();
    }
    return true;
  };
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), watch_keys);
  } catch (const json::exception& e) {
    throw CorruptInput(detail::concat(origin, ": safetensors header is not valid JSON: ", json_error_text(e)));
  }
  LOCKSTEP_THROW_IF_NOT(repeated.empty(), CorruptInput, origin, ": safetensors header names '", repeated.substr(0, 100),
                        "' twice in one object");
  LOCKSTEP_THROW_IF_NOT(header.is_object(), CorruptInput, origin, ": safetensors header is not a JSON object but ",
                        header.type_name());

  SafetensorsData out;
  out.origin = origin;
  const uint64_t data_size = bytes.size() - 8 - n;
  const std::size_t data_start = 8 + static_cast<std::size_t>(n);
  std::vector<Entry> entries;
  for (const auto& item : header.items()) {
    if (item.key() == kMetadataKey) {
      LOCKSTEP_THROW_IF_NOT(item.value().is_object(), CorruptInput, origin, ": safetensors ", kMetadataKey,
                            " is not an object: ", item.value().dump());
      for (const auto& m : item.value().items()) {
        LOCKSTEP_THROW_IF_NOT(m.value().is_string(), CorruptInput, origin, ": safetensors ", kMetadataKey,
                              " value for '", m.key(), "' is not a string: ", m.value().dump());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    Entry entry;
    RawTensor t = parse_tensor(item.key(), item.value(), origin, data_size, entry);
    t.bytes = bytes.substr(data_start + entry.begin, entry.end - entry.begin);
    entries.push_back(entry);
    out.tensors.emplace(item.key(), std::move(t));
  }
  check_coverage(std::move(entries), data_size, origin);
  return out;
}

void save_safetensors(const std::string& path, const SafetensorsData& data) {
  write_file_atomic(path, encode_safetensors(data));
}

SafetensorsData load_safetensors(const std::string& path) { return decode_safetensors(read_file(path), path); }

}  // namespace lockstep::io
