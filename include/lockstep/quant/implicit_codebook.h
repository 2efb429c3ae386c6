// QINCo's implicit neural codebook (Huijben et al. 2024, the reference ResidualVQ's
// implicit_neural_codebook): a residual layer's codes made, for each token, from the layer's base
// codebook and what the layers before it quantized, by a small MLP: f([condition, code]) with a
// projection from 2d to d and `depth` residual blocks (Linear, SiLU, Linear), l2-normalised under cosine
// similarity. Its parameters carry the reference's names: proj_in, layers.<j>.0, layers.<j>.2.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <vector>

namespace lockstep::quant {

struct ImplicitCodebookOptions {
  explicit ImplicitCodebookOptions(int64_t dim) : dim_(dim) {}
  // The blocks' hidden width; 0: dim, as the reference's default.
  ImplicitCodebookOptions& hidden(int64_t h) {
    hidden_ = h;
    return *this;
  }
  ImplicitCodebookOptions& depth(int64_t d) {
    depth_ = d;
    return *this;
  }
  ImplicitCodebookOptions& l2norm_output(bool on) {
    l2norm_output_ = on;
    return *this;
  }
  int64_t dim() const { return dim_; }
  int64_t hidden() const { return hidden_ > 0 ? hidden_ : dim_; }
  int64_t depth() const { return depth_; }
  bool l2norm_output() const { return l2norm_output_; }
  // InvalidArgument with the value: dim < 1, hidden < 0, depth < 0.
  void validate() const;

 private:
  int64_t dim_;
  int64_t hidden_ = 0;
  int64_t depth_ = 4;  // the paper's, and the reference's default
  bool l2norm_output_ = false;
};

class ImplicitCodebookImpl : public torch::nn::Module {
 public:
  // Parameters initialised as torch.nn.Linear's from torch's default generator.
  explicit ImplicitCodebookImpl(ImplicitCodebookOptions options);
  // codes (K, d), condition (M, d) -> each token's codes (M, K, d), differentiable in all three.
  at::Tensor forward(const at::Tensor& codes, const at::Tensor& condition);
  // Each token's own codes (M, k, d), condition (M, d) -> (M, k, d): forward() of just those pairs (what a
  // search chose, so that backward runs the MLP on k codes per token rather than K).
  at::Tensor forward_pairs(const at::Tensor& codes, const at::Tensor& condition);
  const ImplicitCodebookOptions& options() const { return options_; }

 private:
  // [condition, code] pairs (..., 2d) through the projection and blocks.
  at::Tensor transform(const at::Tensor& pairs);

  ImplicitCodebookOptions options_;
  torch::nn::Linear proj_in_{nullptr};
  std::vector<torch::nn::Sequential> blocks_;
};
TORCH_MODULE(ImplicitCodebook);

}  // namespace lockstep::quant
