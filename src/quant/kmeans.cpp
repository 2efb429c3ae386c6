#include "lockstep/quant/kmeans.h"

#include <torch/torch.h>

#include "cuda_kernels.h"
#include "lockstep/core/error.h"
#include "torch_op_paths.h"

namespace lockstep::quant {

namespace detail {
// index_add_ in float64 on the tokens' device; one host sync for the range check.
std::vector<at::Tensor> code_counts_and_sums_torch(const at::Tensor& tokens, const at::Tensor& indices, int64_t k) {
  const int64_t codebooks = tokens.size(0), m = tokens.size(1), d = tokens.size(2);
  const at::Tensor idx = indices.to(torch::kInt64);
  const bool outside = idx.numel() > 0 && (idx.lt(0) | idx.ge(k)).any().item<bool>();
  LOCKSTEP_THROW_IF_NOT(!outside, InvalidArgument, "code index ",
                        idx.masked_select(idx.lt(0) | idx.ge(k))[0].item<int64_t>(), " outside [0, ", k, ")");
  const auto f64 = tokens.options().dtype(torch::kFloat64);
  const at::Tensor rows = (idx + torch::arange(codebooks, idx.options()).unsqueeze(1) * k).reshape({-1});
  at::Tensor counts = torch::zeros({codebooks * k}, f64).index_add_(0, rows, torch::ones({codebooks * m}, f64));
  at::Tensor sums =
      torch::zeros({codebooks * k, d}, f64).index_add_(0, rows, tokens.to(torch::kFloat64).reshape({codebooks * m, d}));
  return {counts, sums};
}
}  // namespace detail

std::vector<at::Tensor> code_counts_and_sums(const at::Tensor& tokens, const at::Tensor& indices, int64_t k) {
  if (tokens.is_cuda() && detail::cuda_kernels_built()) return detail::code_counts_and_sums_cuda(tokens, indices, k);
  if (!tokens.device().is_cpu()) return detail::code_counts_and_sums_torch(tokens, indices, k);
  // A plain loop: LibTorch 1.13's index_add_ on a matrix runs one tensor op per row (~1.5 us each),
  // which made the EMA step of a 16384-token batch cost more than its nearest-code search.
  const int64_t codebooks = tokens.size(0), m = tokens.size(1), d = tokens.size(2);
  at::Tensor counts = torch::zeros({codebooks * k}, torch::kFloat64);
  at::Tensor sums = torch::zeros({codebooks * k, d}, torch::kFloat64);
  const at::Tensor x = tokens.to(torch::kFloat32).contiguous();
  const at::Tensor idx = indices.to(torch::kInt64).contiguous();
  const float* xp = x.data_ptr<float>();
  const int64_t* ip = idx.data_ptr<int64_t>();
  double* cp = counts.data_ptr<double>();
  double* sp = sums.data_ptr<double>();
  for (int64_t c = 0; c < codebooks; ++c) {
    for (int64_t t = 0; t < m; ++t) {
      const int64_t code = ip[c * m + t];
      LOCKSTEP_THROW_IF_NOT(code >= 0 && code < k, InvalidArgument, "code index ", code, " outside [0, ", k, ")");
      const int64_t row = c * k + code;
      cp[row] += 1.0;
      const float* src = xp + (c * m + t) * d;
      double* dst = sp + row * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
    }
  }
  return {counts, sums};
}

std::vector<at::Tensor> to_float_stats(const std::vector<at::Tensor>& stats) {
  std::vector<at::Tensor> out;
  for (const auto& s : stats) out.push_back(s.to(torch::kFloat32));
  return out;
}

KmeansResult kmeans(const at::Tensor& tokens, const at::Tensor& initial, int64_t iters, Metric metric, Reducer& reducer,
                    const CallSite& site) {
  LOCKSTEP_CHECK_ARG(
      tokens.dim() == 3 && initial.dim() == 3 && tokens.size(0) == initial.size(0) && tokens.size(2) == initial.size(2),
      "kmeans: expected tokens (C, M, d) and means (C, K, d), got ", tokens.sizes(), " and ", initial.sizes());
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
    reducer.sum_(stats, site);
    stats = to_float_stats(stats);
    counts = stats[0].view({codebooks, k});
    const at::Tensor empty = (counts == 0).unsqueeze(2);
    at::Tensor new_means = stats[1].view({codebooks, k, -1}) / counts.clamp_min(1).unsqueeze(2);
    if (metric == Metric::Cosine) {
      new_means =
          torch::nn::functional::normalize(new_means, torch::nn::functional::NormalizeFuncOptions().dim(-1).eps(1e-6));
    }
    means = torch::where(empty, means, new_means);
  }
  return {means, counts};
}

}  // namespace lockstep::quant
