#include "lockstep/quant/kmeans.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::quant {

std::vector<at::Tensor> code_counts_and_sums(const at::Tensor& tokens, const at::Tensor& indices, int64_t k) {
  const int64_t codebooks = tokens.size(0);
  const at::Tensor rows = (indices + torch::arange(codebooks, torch::kInt64).mul_(k).unsqueeze(1)).flatten();
  at::Tensor counts = torch::zeros({codebooks * k}, torch::kFloat32).index_add_(0, rows, torch::ones({rows.size(0)}));
  at::Tensor sums = torch::zeros({codebooks * k, tokens.size(2)}, torch::kFloat32)
                        .index_add_(0, rows, tokens.reshape({-1, tokens.size(2)}));
  return {counts, sums};
}

KmeansResult kmeans(const at::Tensor& tokens, const at::Tensor& initial, int64_t iters, Metric metric,
                    Reducer& reducer, const char* tag) {
  LOCKSTEP_CHECK_ARG(tokens.dim() == 3 && initial.dim() == 3 && tokens.size(0) == initial.size(0) &&
                         tokens.size(2) == initial.size(2),
                     "kmeans: expected tokens (C, M, d) and means (C, K, d), got ", tokens.sizes(), " and ",
                     initial.sizes());
  LOCKSTEP_CHECK_ARG(iters >= 1, "kmeans: iters = ", iters, " must be >= 1");
  torch::NoGradGuard no_grad;
  const int64_t codebooks = initial.size(0);
  const int64_t k = initial.size(1);
  at::Tensor means = initial.to(torch::kFloat32).clone();
  at::Tensor counts;
  for (int64_t iter = 0; iter < iters; ++iter) {
    std::vector<at::Tensor> assigned;
    for (int64_t c = 0; c < codebooks; ++c) assigned.push_back(nearest_code(tokens[c], means[c], metric).indices);
    std::vector<at::Tensor> stats = code_counts_and_sums(tokens, torch::stack(assigned), k);
    reducer.sum_(stats, tag);
    counts = stats[0].view({codebooks, k});
    const at::Tensor empty = (counts == 0).unsqueeze(2);
    at::Tensor new_means = stats[1].view({codebooks, k, -1}) / counts.clamp_min(1).unsqueeze(2);
    if (metric == Metric::Cosine) {
      new_means = torch::nn::functional::normalize(
          new_means, torch::nn::functional::NormalizeFuncOptions().dim(-1).eps(1e-6));
    }
    means = torch::where(empty, means, new_means);
  }
  return {means, counts};
}

}  // namespace lockstep::quant
