// The fused FSQ kernel's plan and entry points, and the torch-op path that runs off the CPU:
// internal to src/quant (and its tests), not installed with the library.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/quant/fsq.h"

namespace lockstep::quant {

namespace detail {
// Per-dimension constants of the fused kernel, computed once from the levels with the same
// float32 operations as the definition, and repeated for every token of a chunk so that the
// kernel's inner loop is one flat, vectorisable loop over chunk_tokens * L positions.
struct FsqKernelPlan {
  int64_t num_levels = 0;    // L = len(levels)
  int64_t chunk_tokens = 0;  // tokens per chunk; chunk_tokens * L <= kFsqChunkPositions
  bool symmetric = false;
  bool hard_clamp = false;  // clamp(., -1, 1) where the definition has tanh
  // Default bound: shift, scale = half, offset, half_width = L div 2 (also as int).
  // Symmetric: scale = L - 1, step = 2 / (L - 1). Both: derivative_scale (see the kernel).
  std::vector<float> shift, scale, offset, half_width, step, derivative_scale;
  std::vector<int32_t> half_width_int;
  std::vector<int64_t> basis;  // (L,) mixed-radix basis
};
constexpr int64_t kFsqChunkPositions = 1024;

// Noise dropout for the kernel: an element gets noise when its 32-bit hash < threshold.
struct FsqNoise {
  uint64_t seed = 0;
  uint32_t threshold = 0;      // p * 2^32; 0 means no noise
  int64_t element_offset = 0;  // global index of z's first element: the noise is keyed by it
};

// Tokens [token_begin, token_end) of z (tokens, L) -> codes (tokens, L), indices (tokens,) and,
// when `derivative` is not null, d code / d z (tokens, L). Single-threaded; plain pointers.
void fsq_forward_tokens(const FsqKernelPlan& plan, const float* z, float* codes, int64_t* indices, float* derivative,
                        const FsqNoise& noise, int64_t token_begin, int64_t token_end);
// The index of each of `tokens` codes (tokens, L) by the definition's formula (any codes, not
// only grid points).
void fsq_codes_to_indices(const FsqKernelPlan& plan, const float* codes, int64_t* indices, int64_t tokens);
}  // namespace detail

namespace detail {
// The same pass from torch operations on z's device (what runs off the CPU), with the kernel's
// straight-through gradient and noise; torch's tanh may move a value within ~1e-6 of a rounding
// boundary to the neighbouring level.
FsqCodes fsq_forward_torch(const FsqKernelPlan& plan, const at::Tensor& z, const FsqNoise& noise);
// The fused kernel's pass on a CUDA device (src/quant/cuda/fsq.cu): z contiguous float32 on the
// device, outputs allocated there like z; derivative may be null. Only where cuda_kernels_built().
void fsq_forward_cuda(const FsqKernelPlan& plan, const at::Tensor& z, at::Tensor& codes, at::Tensor& indices,
                      float* derivative, const FsqNoise& noise);
}  // namespace detail

}  // namespace lockstep::quant
