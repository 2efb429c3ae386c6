// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}},
// then the tensors' bytes. Files we write load with Python's `safetensors.numpy.load_file`.
#pragma once

#include <map>
#include <string>

#include "lockstep/io/raw_tensor.h"

namespace lockstep::io {

struct SafetensorsData {
  std::map<std::string, RawTensor> tensors;
  std::map<std::string, std::string> metadata;  // the "__metadata__" table

  // The tensor called `name`; throws CorruptInput naming `name`, `origin` and what is present.
  const RawTensor& at(const std::string& name) const;
  std::string origin;  // file path, for error messages
};

// Serialises to bytes (tensors in name order, 8-byte aligned header as the format recommends).
std::string encode_safetensors(const SafetensorsData& data);
// Parses bytes; every inconsistency (header length, JSON, dtype, shape vs offsets, overlapping or
// out-of-range offsets, trailing bytes) throws CorruptInput naming `origin` and the values.
SafetensorsData decode_safetensors(const std::string& bytes, const std::string& origin);

// File versions: save writes atomically (temporary file + rename).
void save_safetensors(const std::string& path, const SafetensorsData& data);
SafetensorsData load_safetensors(const std::string& path);

}  // namespace lockstep::io
