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
  at::Tensor indices;  // (n,) int64; nearest_codes: (n, k)
  // (n,) float: Euclidean the squared distance |x - e|^2 (clamped at 0), Cosine the dot x.e; nearest_codes: (n, k).
  at::Tensor score;
};

// x: (n, d), codebook: (k, d), k >= 1, on one device; both converted to float32. Ties resolve to
// the lowest code index (as torch's argmin). On the CPU the fused kernel runs; on any other device
// (CUDA) the tiled search built from torch operations, which holds one tile of 2048 tokens x 2048
// codes of scores at a time. Scratch memory is independent of n: one packed copy of the codebook
// (k rounded up to the kernel's code block, times d) and a few rows of d per thread. Results do not
// depend on the thread count. Not differentiable: inputs are used detached.
NearestCode nearest_code(const at::Tensor& x, const at::Tensor& codebook, Metric metric);

// One distance for every search that picks codes (top-k, beam, sampled, k-means): the values
// nearest_code compares, (n, k) float32, smaller nearer: Euclidean |e|^2 - 2 x.e (|x - e|^2 less
// |x|^2), Cosine -x.e, each with nearest_code's own arithmetic on x's device, so that nearest_code's
// index is each row's first smallest here, bit for bit. Holds all n x k values: pass chunks of rows.
at::Tensor code_scores(const at::Tensor& x, const at::Tensor& codebook, Metric metric);

// The order every search ranks in: each row's k smallest of values (n, m), 1 <= k <= m, as (n, k)
// int64 column indices, smallest first, equal values in index order and NaN as +inf (what
// nearest_code's fused minimum does). Any device; CUDA values with k <= 32 take one pass of a top-k
// kernel, not a sort.
at::Tensor smallest_first(const at::Tensor& values, int64_t k);

// Each token's k nearest codes, nearest first, 1 <= k <= codebook size: smallest_first over
// code_scores in chunks of rows (32 MiB of values at most), with scores as nearest_code's. Column 0
// is nearest_code's indices and score, bit for bit.
NearestCode nearest_codes(const at::Tensor& x, const at::Tensor& codebook, Metric metric, int64_t k);

}  // namespace lockstep::quant
