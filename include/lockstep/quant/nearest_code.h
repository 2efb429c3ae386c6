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

// x: (n, d), codebook: (k, d), k >= 1; both converted to float32. Ties resolve to the lowest code
// index (as torch's argmin). Scratch memory is independent of n: one packed copy of the codebook
// (k rounded up to the kernel's code block, times d) and a few rows of d per thread. Results do not
// depend on the thread count. Not differentiable: inputs are used detached.
NearestCode nearest_code(const at::Tensor& x, const at::Tensor& codebook, Metric metric);

namespace detail {
// For tests and benchmarks: the kernels this CPU can run, best (the one nearest_code uses) first,
// among "avx512", "avx2", "generic" ("generic" is always there), and a search with a named one
// (InvalidArgument if this CPU cannot run it). Kernels may round differently from one another.
std::vector<std::string> nearest_code_kernels();
NearestCode nearest_code_with_kernel(const at::Tensor& x, const at::Tensor& codebook, Metric metric,
                                     const std::string& kernel);
}  // namespace detail

}  // namespace lockstep::quant
