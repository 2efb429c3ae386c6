// The gradient of vector-quantize-pytorch's in-place codebook loss, for an optimizer of the caller's
// (the Python module's in_place_codebook_optimizer), taken over the global batch in the training call's
// update: no collective in a forward (docs/python/vq.md, "in_place_codebook_optimizer").
#include <algorithm>

#include "lockstep/quant/kmeans.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant {

std::function<void(Reducer&)> Vq::in_place_update(const at::Tensor& tokens, const at::Tensor& indices,
                                                  const at::Tensor& searched, const at::Tensor& scale) {
  // `this` must outlive a deferred update, as state_update's.
  return [this, tokens, indices, searched, scale](Reducer& reducer) {
    torch::NoGradGuard no_grad;
    const int64_t k = options_.codebook_size();
    const int64_t codebooks = searched.size(0);
    std::vector<at::Tensor> stats = code_counts_and_sums(tokens, indices, k);
    reducer.sum_(stats, LOCKSTEP_CALL_SITE("vq.in_place"));  // once per training call, whatever the data
    // The loss is the mean over every counted token's cd coordinates (in every codebook), so code i's
    // gradient is 2 (count_i code_i - sum_i) / (tokens * cd), in float64 until the end.
    const at::Tensor counts = stats[0].view({codebooks, k, 1});
    const at::Tensor sums = stats[1].view({codebooks, k, -1});
    const double elements = std::max(counts.sum().item<double>(), 1.0) * static_cast<double>(searched.size(2));
    at::Tensor grad = ((counts * searched.to(torch::kFloat64) - sums) * (2.0 / elements)).to(torch::kFloat32);
    if (scale.defined()) grad = grad * scale;  // back through affine_param's transform, to the codes
    in_place_gradient_ = in_place_gradient_.defined() ? in_place_gradient_ + grad : grad;
  };
}

at::Tensor Vq::take_in_place_gradient() {
  at::Tensor taken = std::move(in_place_gradient_);
  in_place_gradient_ = at::Tensor();
  return taken;
}

}  // namespace lockstep::quant
