// Finite scalar quantization (Mentzer et al. 2023), as defined in docs/quantizers.md: each of
// len(levels) dimensions is bounded and rounded to one of levels[i] values; the code index is
// the mixed-radix number of the per-dimension level indices. Codes and indices come from one
// fused pass over memory (src/quant/fsq_kernel.cpp), not a chain of torch ops.
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/quant/option_fields.h"
#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

struct FsqOptions {
  explicit FsqOptions(std::vector<int64_t> levels) : levels_(std::move(levels)) {}

  // Input dimension; unset means levels.size() * num_codebooks (no projection).
  std::optional<int64_t> dim() const { return dim_; }

  // Every option: fsq_options.def, one line each (option_fields.h).
#define LOCKSTEP_OPTIONS FsqOptions
#define LOCKSTEP_OPTIONS_FIELDS "lockstep/quant/fsq_options.def"
#include "lockstep/quant/option_fields.inc"

  // Throws InvalidArgument with the values: a field outside its limits, a level < 2 or > 2^22 (float32
  // rounding limit), no levels, a product of levels beyond 2^31, dim < 1, or noise_dropout > 0 without
  // preserve_symmetry.
  void validate() const;
};

namespace detail {
struct FsqKernelPlan;  // src/quant/fsq_kernel.h: the fused kernel's constants (internal)
}  // namespace detail

// Codes and indices of one pass.
struct FsqCodes {
  at::Tensor codes;    // float32, the shape of z
  at::Tensor indices;  // int64, z's shape without its last axis
};

class Fsq final : public Quantizer {
 public:
  explicit Fsq(FsqOptions options);

  std::string kind() const override { return "fsq"; }
  bool draws_per_item() const override { return options_.noise_dropout() > 0; }
  int64_t dim() const override { return dim_; }
  int64_t codebook_size() const override { return codebook_size_; }
  int64_t num_indices() const override { return options_.num_codebooks(); }

  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  at::Tensor encode(const at::Tensor& x) override;
  at::Tensor decode(const at::Tensor& indices) override;

  // Codes (..., len(levels)) in [-1, 1] <-> indices (...), exact inverses on the grid.
  at::Tensor codes_to_indices(const at::Tensor& codes) const;
  at::Tensor indices_to_codes(const at::Tensor& indices) const;
  // Bounds and rounds z (..., len(levels)) with a straight-through gradient.
  at::Tensor quantize_codes(const at::Tensor& z) const;
  // Codes and indices of z (..., len(levels)) in one pass over memory, split over at::parallel_for
  // for large inputs; off the CPU, the same from torch operations (detail::fsq_forward_torch). z of another dtype or
  // layout is first converted to contiguous float32 (a differentiable copy). The codes' gradient is the
  // straight-through gradient of the bound. With `noise` set (defined or not: undefined means torch's default CPU
  // generator), noise dropout is applied as FsqOptions::noise_dropout says; one 64-bit number is drawn from the
  // generator per call, so the result does not depend on the thread count.
  // `element_offset` is the global index of z's first element (QuantizeContext::first_item).
  FsqCodes quantize_and_index(const at::Tensor& z, const std::optional<at::Generator>& noise = std::nullopt,
                              int64_t element_offset = 0) const;
  // As quantize_and_index without gradient or noise, into preallocated outputs (codes: float32,
  // contiguous, z's shape; indices: int64, contiguous, z's shape without its last axis), so that
  // an encoder reusing its buffers pays no allocation or page faults.
  void quantize_and_index_out(const at::Tensor& z, at::Tensor& codes, at::Tensor& indices) const;

  const FsqOptions& options() const { return options_; }
  const detail::FsqKernelPlan& kernel_plan() const { return *plan_; }  // for tests of the two paths

 private:
  // (b, n, dim) -> (b, n, codebooks, levels) before the bound, projecting when needed.
  at::Tensor to_code_space(const at::Tensor& x);
  at::Tensor from_code_space(const at::Tensor& codes);
  void build_plan();
  // Drops the codebook axis of indices when there is one codebook, adds it back for decode.
  at::Tensor squeeze_indices(const at::Tensor& indices) const;

  FsqOptions options_;
  int64_t dim_;
  int64_t codebook_size_;
  at::Tensor levels_;                                  // (L,) float
  at::Tensor basis_;                                   // (L,) int64 mixed-radix basis
  std::shared_ptr<const detail::FsqKernelPlan> plan_;  // built once from the levels
  torch::nn::Linear project_in_{nullptr};
  torch::nn::Linear project_out_{nullptr};
  at::Tensor rotation_;  // (L, L) with orthogonal_rotation, else undefined
};

}  // namespace lockstep::quant
