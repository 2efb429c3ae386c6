// nearest_code's fused CPU kernels by name and its tiled search from matrix products, for the tests
// and benchmarks that compare them (nearest_code.cpp). Internal to src/quant; not installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/quant/nearest_code.h"

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

// smallest_first by torch operations (a stable sort, or argmin for k = 1): the path of devices without
// the top-k kernel, of float64 and of k > 32; any device.
at::Tensor smallest_first_sorted(const at::Tensor& values, int64_t k);

}  // namespace lockstep::quant::detail
