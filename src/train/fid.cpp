#include "lockstep/train/fid.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/train/weights_file.h"

namespace lockstep::train {

model::FidInception load_fid_inception(const std::string& path, const std::string& key) {
  return model::FidInception(read_weights_file(path, key,
                                               "FID needs pytorch-fid's Inception weights as a safetensors file; "
                                               "docs/losses.md shows how to write it"),
                             key + " = " + path);
}

void FeatureStatistics::add(const at::Tensor& features) {
  LOCKSTEP_CHECK_ARG(features.dim() == 2, "fid: features must be (b, d), got ", features.sizes());
  const at::Tensor f = features.detach().to(at::kCPU, at::kDouble);
  if (!sum_.defined()) {
    sum_ = torch::zeros({f.size(1)}, torch::kFloat64);
    outer_ = torch::zeros({f.size(1), f.size(1)}, torch::kFloat64);
  }
  LOCKSTEP_CHECK_ARG(f.size(1) == sum_.size(0), "fid: features of ", f.size(1), " values after ", sum_.size(0));
  sum_ += f.sum(0);
  outer_ += f.t().mm(f);
  count_ += f.size(0);
}

at::Tensor FeatureStatistics::mean() const {
  LOCKSTEP_CHECK_ARG(count_ >= 1, "fid: no features added");
  return sum_ / static_cast<double>(count_);
}

at::Tensor FeatureStatistics::covariance() const {
  LOCKSTEP_CHECK_ARG(count_ >= 2, "fid: a covariance needs 2 images or more, got ", count_);
  const at::Tensor mu = mean();
  return (outer_ - static_cast<double>(count_) * torch::outer(mu, mu)) / static_cast<double>(count_ - 1);
}

double frechet_distance(const at::Tensor& mu1, const at::Tensor& sigma1, const at::Tensor& mu2,
                        const at::Tensor& sigma2) {
  const at::Tensor m1 = mu1.to(at::kDouble), m2 = mu2.to(at::kDouble);
  const at::Tensor s1 = sigma1.to(at::kDouble), s2 = sigma2.to(at::kDouble);
  LOCKSTEP_CHECK_ARG(m1.sizes() == m2.sizes() && s1.sizes() == s2.sizes() && s1.dim() == 2 &&
                         s1.size(0) == m1.size(0) && s1.size(1) == m1.size(0),
                     "fid: means ", m1.sizes(), " and ", m2.sizes(), ", covariances ", s1.sizes(), " and ", s2.sizes(),
                     " do not match");
  // s1^(1/2) from its eigen-decomposition (symmetric, eigenvalues clamped at 0 against rounding).
  const auto [l1, v1] = torch::linalg_eigh(s1);
  const at::Tensor root1 = v1.mm(torch::diag(l1.clamp_min(0).sqrt())).mm(v1.t());
  const at::Tensor middle = root1.mm(s2).mm(root1);
  const at::Tensor eigenvalues = torch::linalg_eigvalsh((middle + middle.t()) / 2);
  const double trace_root = eigenvalues.clamp_min(0).sqrt().sum().item<double>();
  const at::Tensor diff = m1 - m2;
  return diff.dot(diff).item<double>() + s1.trace().item<double>() + s2.trace().item<double>() - 2 * trace_root;
}

}  // namespace lockstep::train
