// Grouped quantization (vector-quantize-pytorch's GroupedResidualVQ/FSQ/LFQ): the feature axis split
// into G equal parts side by side, each quantized by its own quantizer. As docs/quantizers.md section
// "Grouped variants".
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

class Grouped final : public Quantizer {
 public:
  // `groups` all take vectors of one size d; the grouped quantizer takes G x d.
  Grouped(std::string kind, std::vector<std::shared_ptr<Quantizer>> groups);

  std::string kind() const override { return kind_; }
  bool draws_per_item() const override;
  int64_t dim() const override { return dim_; }
  int64_t codebook_size() const override { return groups_.front()->codebook_size(); }
  // The groups' indices side by side: (b, n, G x each group's num_indices()).
  int64_t num_indices() const override { return num_indices_; }
  MaskSupport mask_support() const override { return groups_.front()->mask_support(); }

  // Losses are the groups' under "group<g>.<name>". Every group starts from the same state of
  // ctx.generator (so under quantize dropout all groups keep the same layers, as the reference's shared
  // seed makes them); afterwards the generator stands where one group's draws left it.
  QuantizerOutput quantize(const at::Tensor& x, const QuantizeContext& ctx) override;
  at::Tensor encode(const at::Tensor& x) override;
  at::Tensor decode(const at::Tensor& indices) override;

  const std::vector<std::shared_ptr<Quantizer>>& groups() const { return groups_; }

 private:
  std::vector<at::Tensor> split(const at::Tensor& x) const;  // (b, n, G d) -> G x (b, n, d)

  std::string kind_;
  int64_t dim_ = 0;
  int64_t num_indices_ = 0;
  std::vector<std::shared_ptr<Quantizer>> groups_;
};

// `groups` quantizers from `make_group`, called in turn (each draws its initial state then).
std::shared_ptr<Grouped> make_grouped(const std::string& kind, int64_t groups,
                                      const std::function<std::shared_ptr<Quantizer>()>& make_group);

}  // namespace lockstep::quant
