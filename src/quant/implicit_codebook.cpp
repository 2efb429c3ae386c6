#include "lockstep/quant/implicit_codebook.h"

#include <torch/torch.h>

#include <string>

#include "lockstep/core/error.h"

namespace lockstep::quant {

void ImplicitCodebookOptions::validate() const {
  LOCKSTEP_CHECK_ARG(dim_ >= 1, "implicit codebook: dim = ", dim_, " must be >= 1");
  LOCKSTEP_CHECK_ARG(hidden_ >= 0, "implicit codebook: hidden = ", hidden_, " must be >= 0 (0: dim)");
  LOCKSTEP_CHECK_ARG(depth_ >= 0, "implicit codebook: depth = ", depth_, " must be >= 0");
}

ImplicitCodebookImpl::ImplicitCodebookImpl(ImplicitCodebookOptions options) : options_(std::move(options)) {
  options_.validate();
  const int64_t d = options_.dim();
  proj_in_ = register_module("proj_in", torch::nn::Linear(2 * d, d));
  auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t j = 0; j < options_.depth(); ++j) {
    // One after the other, as the reference draws them: a function's arguments have no order of evaluation.
    const torch::nn::Linear first(d, options_.hidden());
    const torch::nn::Linear second(options_.hidden(), d);
    blocks_.push_back(
        layers->register_module(std::to_string(j), torch::nn::Sequential(first, torch::nn::SiLU(), second)));
  }
}

at::Tensor ImplicitCodebookImpl::forward(const at::Tensor& codes, const at::Tensor& condition) {
  const int64_t d = options_.dim();
  LOCKSTEP_CHECK_ARG(codes.dim() == 2 && codes.size(1) == d && condition.dim() == 2 && condition.size(1) == d,
                     "implicit codebook: expected codes (K, ", d, ") and a condition (M, ", d, "), got ", codes.sizes(),
                     " and ", condition.sizes());
  const int64_t m = condition.size(0);
  const int64_t k = codes.size(0);
  // [condition, code] for every (token, code), as the reference concatenates them.
  return transform(torch::cat({condition.unsqueeze(1).expand({m, k, d}), codes.unsqueeze(0).expand({m, k, d})}, -1));
}

at::Tensor ImplicitCodebookImpl::forward_pairs(const at::Tensor& codes, const at::Tensor& condition) {
  const int64_t d = options_.dim();
  LOCKSTEP_CHECK_ARG(codes.dim() == 3 && codes.size(2) == d && condition.dim() == 2 && condition.size(1) == d &&
                         codes.size(0) == condition.size(0),
                     "implicit codebook: expected each token's codes (M, k, ", d, ") and a condition (M, ", d,
                     "), got ", codes.sizes(), " and ", condition.sizes());
  return transform(torch::cat({condition.unsqueeze(1).expand(codes.sizes()), codes}, -1));
}

at::Tensor ImplicitCodebookImpl::transform(const at::Tensor& pairs) {
  at::Tensor x = proj_in_->forward(pairs);
  for (auto& block : blocks_) x = block->forward(x) + x;
  if (options_.l2norm_output()) {
    x = torch::nn::functional::normalize(x, torch::nn::functional::NormalizeFuncOptions().dim(-1).eps(1e-6));
  }
  return x;
}

}  // namespace lockstep::quant
