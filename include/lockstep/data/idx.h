// The IDX format of (Fashion-)MNIST, plain or gzip-compressed (detected by magic).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28} for images, {60000} for labels
  std::vector<uint8_t> data;  // product(dims) bytes, row-major
};

// Reads an unsigned-byte (type 0x08) IDX file. Throws IoError when it cannot be opened and
// CorruptInput naming the file for a bad gzip stream, wrong magic, unsupported element type, a
// dimension of zero or absurd size, or a payload shorter or longer than the dimensions say.
IdxArray read_idx(const std::string& path);

// A file's bytes, plain or gzip-compressed, as read_idx reads them; `origin` names it in errors.
IdxArray decode_idx(const std::string& file_bytes, const std::string& origin);

// Parses an uncompressed IDX byte string; `origin` names it in errors.
IdxArray parse_idx(const std::string& bytes, const std::string& origin);

}  // namespace lockstep::data
