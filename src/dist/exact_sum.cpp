#include "lockstep/dist/exact_sum.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "lockstep/core/error.h"

namespace lockstep::dist {
namespace {

// Values and sums stay below 2^62 in magnitude, so int64 never overflows.
constexpr int kTopBit = 62;

// The power of two that takes `largest` (the largest magnitude any piece holds) times `pieces` just
// under 2^62: the scale at which each value is rounded to an integer.
int scale_exponent(double largest, int64_t pieces) {
  if (largest == 0) return 0;
  int exponent = 0;
  std::frexp(largest, &exponent);  // largest < 2^exponent
  int headroom = 0;
  std::frexp(static_cast<double>(pieces), &headroom);  // pieces < 2^headroom
  return kTopBit - exponent - headroom;
}

}  // namespace

ExactSum::ExactSum(std::shared_ptr<Group> group, std::vector<std::vector<int64_t>> shapes, int64_t most_pieces,
                   at::Device device)
    : group_(std::move(group)),
      shapes_(std::move(shapes)),
      most_pieces_(most_pieces),
      on_(at::TensorOptions(torch::kFloat32).device(device)) {
  LOCKSTEP_CHECK_ARG(group_ != nullptr, "ExactSum: no group");
  LOCKSTEP_CHECK_ARG(most_pieces_ >= 1, "ExactSum: most_pieces = ", most_pieces_, " must be at least 1");
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const auto& shape : shapes_) {
    offsets_.push_back(offset);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    sizes.push_back(n);
    offset += n;
  }
  offsets_.push_back(offset);
  tensor_of_ = torch::repeat_interleave(torch::arange(static_cast<int64_t>(sizes.size()), on_.dtype(torch::kInt64)),
                                        torch::tensor(sizes, on_.dtype(torch::kInt64)));
}

void ExactSum::add(const std::vector<at::Tensor>& piece) {
  LOCKSTEP_CHECK_ARG(piece.size() == shapes_.size(), "ExactSum: a piece of ", piece.size(), " tensors, expected ",
                     shapes_.size());
  LOCKSTEP_CHECK_ARG(pieces() < most_pieces_, "ExactSum: more than the ", most_pieces_, " pieces it was made for");
  at::Tensor flat = torch::zeros({offsets_.back()}, on_);
  for (size_t i = 0; i < piece.size(); ++i) {
    if (!piece[i].defined()) continue;
    const int64_t n = offsets_[i + 1] - offsets_[i];
    LOCKSTEP_CHECK_ARG(piece[i].numel() == n, "ExactSum: tensor ", i, " of a piece has ", piece[i].numel(),
                       " values, expected ", n);
    flat.narrow(0, offsets_[i], n).copy_(piece[i].detach().reshape({-1}));
  }
  pieces_.push_back(flat);
}

std::vector<at::Tensor> ExactSum::finish(const CallSite& site) {
  torch::NoGradGuard no_grad;
  const auto tensors = static_cast<int64_t>(shapes_.size());
  const at::TensorOptions f64 = on_.dtype(torch::kFloat64);
  // Each value's largest magnitude over this rank's pieces (infinity standing for NaN too, which
  // every reduction's max keeps), then each tensor's, then over the ranks.
  at::Tensor value_max = torch::zeros({offsets_.back()}, on_);
  for (const at::Tensor& flat : pieces_) value_max = torch::maximum(value_max, flat.abs());
  value_max = torch::where(torch::isfinite(value_max), value_max, std::numeric_limits<float>::infinity());
  std::vector<at::Tensor> maxima{torch::zeros({tensors}, f64).scatter_reduce(0, tensor_of_, value_max.to(f64), "amax")};
  scale_tag_ = std::string(site.tag) + ".scale";
  group_->all_reduce(maxima, ReduceOp::Max, CallSite{scale_tag_.c_str(), site.file, site.line});
  const at::Tensor host_largest = maxima[0].to(torch::kCPU);
  // Each tensor's scale 2^e and its inverse, as float64 powers of two made here (LibTorch 1.13's
  // ldexp computes 2^e in float32, which overflows at the scales of tiny values).
  std::vector<double> scale(static_cast<size_t>(tensors)), inverse(static_cast<size_t>(tensors));
  std::vector<int64_t> finite(static_cast<size_t>(tensors));
  for (int64_t i = 0; i < tensors; ++i) {
    const double m = host_largest[i].item<double>();
    finite[i] = std::isfinite(m) ? 1 : 0;
    const int e = finite[i] ? scale_exponent(m, most_pieces_) : 0;
    scale[i] = std::ldexp(1.0, e);
    inverse[i] = std::ldexp(1.0, -e);
  }
  const at::Tensor value_scale = torch::tensor(scale, f64).index_select(0, tensor_of_);
  const at::Tensor value_inverse = torch::tensor(inverse, f64).index_select(0, tensor_of_);
  const at::Tensor value_finite =
      torch::tensor(finite, on_.dtype(torch::kInt64)).index_select(0, tensor_of_).to(torch::kBool);
  // Rounded to integers piece by piece (scaling by a power of two is exact in float64), summed exactly.
  at::Tensor sum = torch::zeros({offsets_.back()}, on_.dtype(torch::kInt64));
  for (const at::Tensor& flat : pieces_) {
    const at::Tensor scaled = (flat.to(torch::kFloat64) * value_scale).round();
    sum.add_(torch::where(value_finite, scaled, 0.0).to(torch::kInt64));
  }
  pieces_.clear();
  std::vector<at::Tensor> sums{sum};
  group_->all_reduce(sums, ReduceOp::Sum, site);
  const at::Tensor total =
      torch::where(value_finite, sums[0].to(torch::kFloat64) * value_inverse, std::numeric_limits<double>::quiet_NaN())
          .to(torch::kFloat32);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < tensors; ++i) {
    out.push_back(total.narrow(0, offsets_[i], offsets_[i + 1] - offsets_[i]).reshape(shapes_[static_cast<size_t>(i)]));
  }
  return out;
}

}  // namespace lockstep::dist
