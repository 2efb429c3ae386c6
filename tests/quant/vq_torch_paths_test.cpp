// The torch-operation forms of the VQ statistics and sampling noise (what runs off the CPU), run on the
// CPU against the host computations they must equal bit for bit.
#include "quant/torch_op_paths.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/core/random.h"
#include "lockstep/quant/kmeans.h"

namespace lockstep::quant {
namespace {

// The EMA and k-means statistics off the CPU come from index_add_ (what CUDA runs): on the CPU it
// adds in token order like the loop, so the float64 counts and sums are the loop's exactly.
TEST(CodeStatistics, TheTorchPathGivesTheLoopsCountsAndSums) {
  torch::manual_seed(21);
  const at::Tensor tokens = torch::randn({3, 500, 7});
  const at::Tensor indices = torch::randint(0, 40, {3, 500}, torch::kInt64);
  const auto loop = code_counts_and_sums(tokens, indices, 40);
  const auto ops = detail::code_counts_and_sums_torch(tokens, indices, 40);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].scalar_type(), torch::kFloat64);
  EXPECT_TRUE(torch::equal(ops[0], loop[0]));
  EXPECT_TRUE(torch::equal(ops[1], loop[1]));
  EXPECT_EQ(ops[0].sum().item<double>(), 1500.0);
  const at::Tensor bad = indices.clone();
  bad[2][7] = 40;
  try {
    detail::code_counts_and_sums_torch(tokens, bad, 40);
    FAIL() << "accepted code index 40 of 40";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("code index 40 outside [0, 40)"), std::string::npos) << e.what();
  }
}

// Stochastic code assignment off the CPU draws its noise from torch integer operations: for any key
// and any counter (those past 2^63 arrive as negative int64) the same float as the host's hash.
TEST(SamplingNoise, TheTorchHashGivesTheHostsUniformsBitForBit) {
  std::vector<int64_t> counters;
  for (int64_t c = 0; c < 3000; ++c) counters.push_back(c * 7919);
  for (uint64_t c : {uint64_t{1} << 62, (uint64_t{1} << 63) + 5, ~uint64_t{0}, uint64_t{0x9E3779B97F4A7C15}}) {
    counters.push_back(static_cast<int64_t>(c));
  }
  const at::Tensor t = torch::tensor(counters, torch::kInt64);
  for (uint64_t key : {uint64_t{0}, uint64_t{12345}, ~uint64_t{0} - 17, uint64_t{0xDEADBEEFCAFEF00D}}) {
    const at::Tensor u = detail::hashed_uniform_torch(key, t);
    ASSERT_EQ(u.scalar_type(), torch::kFloat32);
    const float* p = u.data_ptr<float>();
    int64_t differ = 0;
    for (size_t i = 0; i < counters.size(); ++i) {
      differ += p[i] != hashed_uniform(key, static_cast<uint64_t>(counters[i]));
    }
    EXPECT_EQ(differ, 0) << "key " << key;
  }
  EXPECT_THROW(detail::hashed_uniform_torch(1, torch::zeros({3})), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::quant
