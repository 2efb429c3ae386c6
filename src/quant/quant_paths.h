// The quantizers' alternative paths, for the tests and benchmarks that compare them: the fused CPU
// kernels by name, and the device-independent paths from torch operations that run off the CPU.
// Internal to src/quant (and its tests and benchmarks); not installed with the library.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/quant/kmeans.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant::detail {

// For tests and benchmarks: the fused kernels this CPU can run, best (the one nearest_code uses)
// first, among "avx512", "avx2", "generic" ("generic" is always there), and a search with a named
// one, or "tiled" for the device-independent search (InvalidArgument if this CPU cannot run it).
// Kernels may round differently from one another.
std::vector<std::string> nearest_code_kernels();
NearestCode nearest_code_with_kernel(const at::Tensor& x, const at::Tensor& codebook, Metric metric,
                                     const std::string& kernel);
// The device-independent search with tiles of tile_tokens x tile_codes scores from matrix
// products. Their rounding of one dot product may depend on its place in the product and on the
// thread count, so an exact copy of a code may win a tie over a lower index (an equally near
// code), and results are not bitwise thread-invariant as the fused kernels are.
NearestCode nearest_code_tiled(const at::Tensor& x, const at::Tensor& codebook, Metric metric, int64_t tile_tokens,
                               int64_t tile_codes);
// code_scores and nearest_codes with a named kernel, as nearest_code_with_kernel names them: each
// ranks the values that kernel's nearest_code_with_kernel compares ("tiled": its default tiles,
// counted from x's first row).
at::Tensor code_scores_with_kernel(const at::Tensor& x, const at::Tensor& codebook, Metric metric,
                                   const std::string& kernel);
NearestCode nearest_codes_with_kernel(const at::Tensor& x, const at::Tensor& codebook, Metric metric, int64_t k,
                                      const std::string& kernel);

// code_counts_and_sums from torch operations (index_add_), what runs for tokens off the CPU. On
// CUDA the float64 additions run in no fixed order, which can change a float64 sum's last bits
// (not, in practice, its float32 rounding).
std::vector<at::Tensor> code_counts_and_sums_torch(const at::Tensor& tokens, const at::Tensor& indices, int64_t k);

// lfq_sum_probs with each chunk's products built from torch operations and its backward through
// autograd (what runs off the CPU, where lfq_sum_probs uses it); the same chunking and memory bound.
at::Tensor lfq_sum_probs_ops(const at::Tensor& x, double inv_temperature, double code_value,
                             int64_t budget_bytes = int64_t{64} << 20);

// The rotation trick from torch operations (what runs off the CPU).
at::Tensor rotate_to_torch(const at::Tensor& x, const at::Tensor& q);
// hashed_uniform(key, c) for each int64 counter c (its bits read as uint64), in 64-bit torch
// integer operations on the counters' device: the sampling noise of stochastic code assignment.
at::Tensor hashed_uniform_torch(uint64_t key, const at::Tensor& counters);

// The CUDA kernels of src/quant/cuda (cuda_kernels.cpp): whether this build compiled them (nvcc
// and a LibTorch with CUDA), and the searches and statistics they compute, for CUDA tensors. The
// public calls use them for CUDA tensors where built, the torch-op paths above elsewhere.
bool cuda_kernels_built();
NearestCode nearest_code_cuda(const at::Tensor& x, const at::Tensor& codebook, Metric metric);
at::Tensor code_scores_cuda(const at::Tensor& x, const at::Tensor& codebook, Metric metric);
at::Tensor squared_norms_cuda(const at::Tensor& x);  // |x|^2 per row, as nearest_code_cuda's score adds it
std::vector<at::Tensor> code_counts_and_sums_cuda(const at::Tensor& tokens, const at::Tensor& indices, int64_t k);

// The bytes a training call of an LFQ with `codebooks` codebooks of `codes` codes holds at its peak,
// for the memory check before anything is allocated.
double lfq_training_bytes(int64_t codebooks, int64_t codes);

}  // namespace lockstep::quant::detail
