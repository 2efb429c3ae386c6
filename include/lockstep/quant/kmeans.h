// Lloyd's k-means over the global batch, for VQ codebook initialisation: every round assigns with
// the tiled nearest-code search and sums (count, sum) through the Reducer, so holders of parts of
// a batch reach the means of the whole batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/reduce.h"

namespace lockstep::quant {

struct KmeansResult {
  at::Tensor means;   // (C, K, d)
  at::Tensor counts;  // (C, K) tokens assigned in the last round, summed over holders
};

// tokens: (C, M, d), one set per codebook; initial: (C, K, d). `iters` rounds, each one
// reducer.sum_ call (at `site`) carrying every codebook's statistics. An empty cluster keeps its
// previous mean; with Metric::Cosine the means are l2-normalised. Not differentiable.
KmeansResult kmeans(const at::Tensor& tokens, const at::Tensor& initial, int64_t iters, Metric metric, Reducer& reducer,
                    const CallSite& site = LOCKSTEP_CALL_SITE("kmeans"));

// Per-code token counts (C*K) and sums (C*K, d) of tokens (C, M, d) assigned `indices` (C, M):
// codebook c's code i is row c*K + i, so every codebook travels in one reduction. float64, so that
// sums over any split of the tokens (W ranks, then their sum) round to the same float32 as one sum
// over all of them: the error of a double sum (2^-53 of the sum of magnitudes) decides the float
// only when the exact sum lies that close to a midpoint between two floats.
// Reduce them, then convert with to_float_stats().
std::vector<at::Tensor> code_counts_and_sums(const at::Tensor& tokens, const at::Tensor& indices, int64_t k);
// The reduced statistics, rounded to float32 once.
std::vector<at::Tensor> to_float_stats(const std::vector<at::Tensor>& stats);

}  // namespace lockstep::quant
