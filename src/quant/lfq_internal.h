// LFQ's internals that its tests reach: the entropy's torch-op path (lfq_entropy.cpp) and the memory
// bound of a training call (lfq.cpp). Internal to src/quant; not installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace lockstep::quant::detail {

// lfq_sum_probs with each chunk's products built from torch operations and its backward through
// autograd (what runs off the CPU where the CUDA kernels do not: float64, another device, a build without
// them); the same chunking and memory bound.
at::Tensor lfq_sum_probs_ops(const at::Tensor& x, double inv_temperature, double code_value,
                             int64_t budget_bytes = int64_t{64} << 20);

// lfq_per_sample_entropy by torch operations (differentiable twice): what runs on the CPU, for float64 and
// where the CUDA kernels do not.
at::Tensor lfq_per_sample_entropy_ops(const at::Tensor& x, double inv_temperature, double code_value);

// The bytes a training call of an LFQ with `codebooks` codebooks of `codes` codes holds at its peak,
// for the memory check before anything is allocated.
double lfq_training_bytes(int64_t codebooks, int64_t codes);

}  // namespace lockstep::quant::detail
