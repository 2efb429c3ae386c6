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

}  // namespace lockstep::quant
