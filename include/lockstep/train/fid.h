// FID between two sets of images (Heusel et al. 2017), from FID Inception features: the Fréchet
// distance between the Gaussians fitted to each set's features. In evaluation, rFID: the held-out
// images against their reconstructions.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "lockstep/model/inception.h"

namespace lockstep::train {

// Reads the user's FID Inception weights (a safetensors file). Throws IoError when `path` is
// missing and InvalidArgument when it holds another layout; `key` names the setting in messages.
model::FidInception load_fid_inception(const std::string& path, const std::string& key);

// Mean and covariance (normalised by n - 1, as numpy.cov) of feature vectors, added batch by
// batch, in float64.
class FeatureStatistics {
 public:
  void add(const at::Tensor& features);  // (b, d)
  int64_t count() const { return count_; }
  at::Tensor mean() const;
  at::Tensor covariance() const;  // needs count() >= 2

 private:
  int64_t count_ = 0;
  at::Tensor sum_, outer_;
};

// ||mu1 - mu2||^2 + tr(s1) + tr(s2) - 2 tr((s1 s2)^(1/2)), the trace of the root taken as
// sum sqrt(eig(s1^(1/2) s2 s1^(1/2))), in float64.
double frechet_distance(const at::Tensor& mu1, const at::Tensor& sigma1, const at::Tensor& mu2,
                        const at::Tensor& sigma2);

}  // namespace lockstep::train
