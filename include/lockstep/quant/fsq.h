// Finite scalar quantization (Mentzer et al. 2023), as defined in docs/quantizers.md: each of
// len(levels) dimensions is bounded and rounded to one of levels[i] values; the code index is
// the mixed-radix number of the per-dimension level indices.
#pragma once

#include <optional>
#include <vector>

#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

struct FsqOptions {
  explicit FsqOptions(std::vector<int64_t> levels) : levels_(std::move(levels)) {}

  // Input dimension; unset means levels.size() * num_codebooks (no projection).
  FsqOptions& dim(int64_t d) { dim_ = d; return *this; }
  FsqOptions& num_codebooks(int64_t n) { num_codebooks_ = n; return *this; }
  // Use the symmetric bound 2/(L-1) * floor((L-1)(tanh z + 1)/2 + 0.5) - 1.
  FsqOptions& preserve_symmetry(bool on) { preserve_symmetry_ = on; return *this; }

  const std::vector<int64_t>& levels() const { return levels_; }
  std::optional<int64_t> dim() const { return dim_; }
  int64_t num_codebooks() const { return num_codebooks_; }
  bool preserve_symmetry() const { return preserve_symmetry_; }

  // Throws InvalidArgument with the values: a level < 2, no levels, codebooks < 1, a product of
  // levels beyond 2^31, dim < 1.
  void validate() const;

 private:
  std::vector<int64_t> levels_;
  std::optional<int64_t> dim_;
  int64_t num_codebooks_ = 1;
  bool preserve_symmetry_ = false;
};

class Fsq final : public Quantizer {
 public:
  explicit Fsq(FsqOptions options);

  std::string kind() const override { return "fsq"; }
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

  const FsqOptions& options() const { return options_; }

 private:
  // (b, n, dim) -> (b, n, codebooks, levels) before the bound, projecting when needed.
  at::Tensor to_code_space(const at::Tensor& x);
  at::Tensor from_code_space(const at::Tensor& codes);
  // Drops the codebook axis of indices when there is one codebook, adds it back for decode.
  at::Tensor squeeze_indices(const at::Tensor& indices) const;

  FsqOptions options_;
  int64_t dim_;
  int64_t codebook_size_;
  at::Tensor levels_;  // (L,) float
  at::Tensor basis_;   // (L,) int64 mixed-radix basis
  torch::nn::Linear project_in_{nullptr};
  torch::nn::Linear project_out_{nullptr};
};

}  // namespace lockstep::quant
