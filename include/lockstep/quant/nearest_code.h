// Nearest-code search for vector quantizers without the n x k distance matrix: tiles of tokens x
// codes go through a matrix product into a small reused buffer, and the arg-min is fused per tile
// (LibTorch's CPU argmin is scalar; see docs/machine.md in the shared notes).
#pragma once

#include <ATen/core/Tensor.h>

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
// index (as torch's argmin). Scratch memory is O(tile * tile) per thread, independent of n and k.
// Not differentiable: inputs are used detached.
NearestCode nearest_code(const at::Tensor& x, const at::Tensor& codebook, Metric metric);

}  // namespace lockstep::quant
