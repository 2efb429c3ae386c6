#include "lockstep/io/raw_tensor.h"

#include <array>
#include <utility>

#include "lockstep/core/error.h"

namespace lockstep::io {
namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  std::size_t size;
};
constexpr std::array<DTypeInfo, 10> kDTypes{{{DType::F64, "F64", 8},
                                             {DType::F32, "F32", 4},
                                             {DType::F16, "F16", 2},
                                             {DType::BF16, "BF16", 2},
                                             {DType::I64, "I64", 8},
                                             {DType::I32, "I32", 4},
                                             {DType::I16, "I16", 2},
                                             {DType::I8, "I8", 1},
                                             {DType::U8, "U8", 1},
                                             {DType::Bool, "BOOL", 1}}};

const DTypeInfo& info(DType dtype) {
  for (const auto& i : kDTypes) {
    if (i.dtype == dtype) return i;
  }
  throw InvalidArgument(detail::concat("unknown dtype code ", static_cast<int>(dtype)));
}
}  // namespace

std::size_t dtype_size(DType dtype) { return info(dtype).size; }
std::string dtype_name(DType dtype) { return info(dtype).name; }

DType dtype_from_name(const std::string& name, const std::string& where) {
  std::string valid;
  for (const auto& i : kDTypes) {
    if (name == i.name) return i.dtype;
    valid += (valid.empty() ? "" : ", ") + std::string(i.name);
  }
  throw CorruptInput(detail::concat(where, ": unknown dtype '", name, "' (valid: ", valid, ")"));
}

int64_t RawTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace lockstep::io
