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

#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

struct FsqOptions {
  explicit FsqOptions(std::vector<int64_t> levels) : levels_(std::move(levels)) {}

  // Input dimension; unset means levels.size() * num_codebooks (no projection).
  FsqOptions& dim(int64_t d) {
    dim_ = d;
    return *this;
  }
  FsqOptions& num_codebooks(int64_t n) {
    num_codebooks_ = n;
    return *this;
  }
  // Use the symmetric bound 2/(L-1) * floor((L-1)(tanh z + 1)/2 + 0.5) - 1.
  FsqOptions& preserve_symmetry(bool on) {
    preserve_symmetry_ = on;
    return *this;
  }
  // Bound with clamp(., -1, 1) where the definition has tanh (the reference's bound_hard_clamp, for
  // inputs already squashed into range, as residual FSQ's are): the gradient is 1 inside (-1, 1) and
  // 0 elsewhere, as torch 2's clamp; the default bound's shift is offset / half, not its atanh.
  FsqOptions& bound_hard_clamp(bool on) {
    bound_hard_clamp_ = on;
    return *this;
  }
  // Training only, needs preserve_symmetry. After the indices are computed, each element of the
  // quantized code independently, with probability p, gets an offset u ~ U[-0.5, 0.5) added and
  // the sum clamped to [-1, 1] (docs/quantizers.md; the Python reference adds the same offset to
  // the bounded value without a clamp). The gradient is unchanged: still the straight-through
  // gradient of the bound, also where the clamp bit. Indices are never affected. Randomness: one
  // 64-bit draw per forward from QuantizeContext::generator (torch's default CPU generator when
  // undefined), expanded per element by a counter-based hash; eval mode draws nothing.
  FsqOptions& noise_dropout(double p) {
    noise_dropout_ = p;
    return *this;
  }
  // The projections in and out have biases (the reference's projection_has_bias).
  FsqOptions& projection_has_bias(bool on) {
    projection_has_bias_ = on;
    return *this;
  }
  // Each codebook's code-space vectors turned by a fixed random orthogonal matrix (buffer orthogonal_rot,
  // drawn from the default generator) before quantization and back after (the reference's
  // orthogonal_rotation; better code use without an auxiliary loss).
  FsqOptions& orthogonal_rotation(bool on) {
    orthogonal_rotation_ = on;
    return *this;
  }

  const std::vector<int64_t>& levels() const { return levels_; }
  std::optional<int64_t> dim() const { return dim_; }
  int64_t num_codebooks() const { return num_codebooks_; }
  bool preserve_symmetry() const { return preserve_symmetry_; }
  bool bound_hard_clamp() const { return bound_hard_clamp_; }
  double noise_dropout() const { return noise_dropout_; }
  bool projection_has_bias() const { return projection_has_bias_; }
  bool orthogonal_rotation() const { return orthogonal_rotation_; }

  // Throws InvalidArgument with the values: a level < 2 or > 2^22 (float32 rounding limit), no
  // levels, codebooks < 1, a product of levels beyond 2^31, dim < 1, noise_dropout outside
  // [0, 1), or noise_dropout > 0 without preserve_symmetry.
  void validate() const;

 private:
  std::vector<int64_t> levels_;
  std::optional<int64_t> dim_;
  int64_t num_codebooks_ = 1;
  bool preserve_symmetry_ = false;
  bool bound_hard_clamp_ = false;
  double noise_dropout_ = 0.0;
  bool projection_has_bias_ = true;
  bool orthogonal_rotation_ = false;
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
