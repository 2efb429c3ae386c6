#include "lockstep/io/tensor_convert.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>

#include "lockstep/core/error.h"
#include "lockstep/io/npy.h"
#include "lockstep/io/safetensors.h"

namespace {

using lockstep::io::DType;
using lockstep::io::from_raw;
using lockstep::io::RawTensor;
using lockstep::io::to_raw;

TEST(TensorConvert, RoundTripsEveryDTypeBitExactly) {
  const std::pair<torch::Dtype, DType> types[] = {{torch::kFloat, DType::F32}, {torch::kDouble, DType::F64},
                                                  {torch::kHalf, DType::F16},  {torch::kBFloat16, DType::BF16},
                                                  {torch::kLong, DType::I64},  {torch::kInt, DType::I32},
                                                  {torch::kShort, DType::I16}, {torch::kChar, DType::I8},
                                                  {torch::kByte, DType::U8},   {torch::kBool, DType::Bool}};
  for (const auto& [torch_type, raw_type] : types) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{}, {0}, {2, 0, 3}, {3, 4}}) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      const torch::Tensor t = (torch::arange(numel, torch::kLong) * 37 % 101 - 50).reshape(shape).to(torch_type);
      const RawTensor r = to_raw(t);
      EXPECT_EQ(r.dtype, raw_type);
      EXPECT_EQ(r.shape, shape);
      EXPECT_EQ(r.bytes.size(), static_cast<std::size_t>(t.nbytes()));
      const torch::Tensor back = from_raw(r);
      EXPECT_EQ(back.scalar_type(), torch_type);
      EXPECT_EQ(back.sizes(), t.sizes());
      EXPECT_TRUE(torch::equal(back, t)) << torch_type;
    }
  }
}

TEST(TensorConvert, NonContiguousInputIsStoredInLogicalOrder) {
  const torch::Tensor t = torch::arange(6, torch::kInt).reshape({2, 3}).t();  // [[0,3],[1,4],[2,5]]
  const RawTensor r = to_raw(t);
  EXPECT_EQ(r.shape, (std::vector<int64_t>{3, 2}));
  std::vector<int32_t> values(6);
  std::memcpy(values.data(), r.bytes.data(), r.bytes.size());
  EXPECT_EQ(values, (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST(TensorConvert, FromRawOwnsItsMemoryAndChecksSize) {
  RawTensor r = to_raw(torch::tensor({1.5f, -2.0f}));
  const torch::Tensor t = from_raw(r);
  r.bytes.assign(r.bytes.size(), '\0');  // the tensor must not alias the RawTensor
  EXPECT_FLOAT_EQ(t[0].item<float>(), 1.5f);
  r.bytes.pop_back();
  EXPECT_THROW(from_raw(r), lockstep::CorruptInput);
  EXPECT_THROW(to_raw(torch::zeros({2}, torch::kComplexFloat)), lockstep::InvalidArgument);
}

TEST(TensorConvert, SurvivesSafetensorsAndNpy) {
  const torch::Tensor t = torch::randn({4, 5}, torch::kDouble);
  lockstep::io::SafetensorsData data;
  data.tensors["t"] = to_raw(t);
  const auto back = lockstep::io::decode_safetensors(lockstep::io::encode_safetensors(data), "mem");
  EXPECT_TRUE(torch::equal(from_raw(back.at("t")), t));
  EXPECT_TRUE(torch::equal(from_raw(lockstep::io::decode_npy(lockstep::io::encode_npy(to_raw(t)), "mem")), t));
}

}  // namespace
