// Nearest-code search for vector quantizers without the n x k distance matrix: a register-blocked
// kernel computes a few tokens x a few codes of the distances in vector registers and folds them
// into a running arg-min at once (no BLAS; LibTorch's CPU argmin is scalar, see docs/machine.md in
// the shared notes). The kernel is chosen at run time by the CPU's instruction set.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace lockstep::quant {

enum class Metric {
  Euclidean,  // smallest |x - e|^2
  Cosine,     // largest x.e (inputs already l2-normalised by the caller)
};

struct NearestCode {
  at::Tensor indices;  // (n,) int64
  // (n,) float: Euclidean the squared distance |x - e|^2 (clamped at 0), Cosine the dot x.e.
  at::Tensor score;
};

// x: (n, d), codebook: (k, d), k >= 1, on one device; both converted to float32. Ties resolve to
// the lowest code index (as torch's argmin). On the CPU the fused kernel runs; on any other device
// (CUDA) the tiled search built from torch operations, which holds one tile of 2048 tokens x 2048
// codes of scores at a time. Scratch memory is independent of n: one packed copy of the codebook
// (k rounded up to the kernel's code block, times d) and a few rows of d per thread. Results do not
// depend on the thread count. Not differentiable: inputs are used detached.
NearestCode nearest_code(const at::Tensor& x, const at::Tensor& codebook, Metric metric);

namespace detail {
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
}  // namespace detail

}  // namespace lockstep::quant
