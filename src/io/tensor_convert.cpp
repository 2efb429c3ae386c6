#include "lockstep/io/tensor_convert.h"

#include <torch/torch.h>

#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep::io {
namespace {

// RawTensor is little-endian by definition; a big-endian host would need byte swaps here.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "lockstep assumes a little-endian host");

struct Pair {
  at::ScalarType torch;
  DType raw;
};
constexpr Pair kPairs[] = {{at::kFloat, DType::F32},     {at::kDouble, DType::F64}, {at::kHalf, DType::F16},
                           {at::kBFloat16, DType::BF16}, {at::kLong, DType::I64},   {at::kInt, DType::I32},
                           {at::kShort, DType::I16},     {at::kChar, DType::I8},    {at::kByte, DType::U8},
                           {at::kBool, DType::Bool}};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

RawTensor to_raw(const at::Tensor& t) {
  LOCKSTEP_CHECK_ARG(t.defined(), "to_raw: undefined tensor");
  RawTensor r;
  bool found = false;
  for (const auto& p : kPairs) {
    if (p.torch == t.scalar_type()) {
      r.dtype = p.raw;
      found = true;
    }
  }
  LOCKSTEP_CHECK_ARG(found, "to_raw: torch dtype ", t.scalar_type(), " has no file-format equivalent");
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  r.shape.assign(c.sizes().begin(), c.sizes().end());
  r.bytes.resize(c.nbytes());
  if (!r.bytes.empty()) std::memcpy(r.bytes.data(), c.data_ptr(), r.bytes.size());
  return r;
}

at::Tensor from_raw(const RawTensor& r) {
  at::ScalarType type = at::kFloat;
  for (const auto& p : kPairs) {
    if (p.raw == r.dtype) type = p.torch;
  }
  int64_t need = static_cast<int64_t>(dtype_size(r.dtype));
  for (int64_t d : r.shape) {
    LOCKSTEP_THROW_IF_NOT(d >= 0 && !__builtin_mul_overflow(need, d, &need), CorruptInput, "from_raw: invalid shape ",
                          shape_text(r.shape));
  }
  LOCKSTEP_THROW_IF_NOT(static_cast<uint64_t>(need) == r.bytes.size(), CorruptInput, "from_raw: ", dtype_name(r.dtype),
                        " tensor of shape ", shape_text(r.shape), " needs ", need, " bytes but has ", r.bytes.size());
  at::Tensor t = torch::empty(r.shape, torch::TensorOptions().dtype(type));
  if (need > 0) std::memcpy(t.data_ptr(), r.bytes.data(), r.bytes.size());
  return t;
}

}  // namespace lockstep::io
