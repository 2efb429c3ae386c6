// A tensor as bytes: what file formats (safetensors, .npy) store, without depending on torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::io {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool };

// Bytes per element of `dtype`.
std::size_t dtype_size(DType dtype);
// The safetensors spelling ("F32", "I64", ...).
std::string dtype_name(DType dtype);
// Inverse of dtype_name; throws CorruptInput naming `where` and the valid names for an unknown name.
DType dtype_from_name(const std::string& name, const std::string& where);

// A dense row-major (C-order), little-endian tensor.
struct RawTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string bytes;  // numel * dtype_size(dtype) bytes

  int64_t numel() const;
};

}  // namespace lockstep::io
