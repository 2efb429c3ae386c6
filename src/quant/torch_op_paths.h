// The device-independent paths from torch operations, what runs off the CPU where a fused CPU kernel
// runs on it; the tests compare the two. Internal to src/quant; not installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace lockstep::quant::detail {

// code_counts_and_sums from torch operations (index_add_), what runs for tokens off the CPU. On
// CUDA the float64 additions run in no fixed order, which can change a float64 sum's last bits
// (not, in practice, its float32 rounding).
std::vector<at::Tensor> code_counts_and_sums_torch(const at::Tensor& tokens, const at::Tensor& indices, int64_t k);

// The rotation trick from torch operations (what runs off the CPU).
at::Tensor rotate_to_torch(const at::Tensor& x, const at::Tensor& q);
// hashed_uniform(key, c) for each int64 counter c (its bits read as uint64), in 64-bit torch
// integer operations on the counters' device: the sampling noise of stochastic code assignment.
at::Tensor hashed_uniform_torch(uint64_t key, const at::Tensor& counters);

}  // namespace lockstep::quant::detail
