// Adam with decoupled weight decay (AdamW), with its state as named tensors so that checkpoints
// hold it explicitly and a resumed run continues bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::train {

struct AdamOptions {
  AdamOptions& lr(double v) {
    lr_ = v;
    return *this;
  }
  AdamOptions& betas(double b1, double b2) {
    beta1_ = b1;
    beta2_ = b2;
    return *this;
  }
  AdamOptions& eps(double v) {
    eps_ = v;
    return *this;
  }
  AdamOptions& weight_decay(double v) {
    weight_decay_ = v;
    return *this;
  }
  double lr_ = 1e-3, beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8, weight_decay_ = 0.0;
};

class Adam {
 public:
  // Parameters by name (as named_parameters() gives them); only those requiring grad are updated.
  Adam(std::vector<std::pair<std::string, at::Tensor>> params, AdamOptions options);

  void zero_grad();
  // One update from the parameters' current gradients; parameters without a gradient are skipped.
  void step();
  void set_lr(double lr) { options_.lr_ = lr; }

  int64_t steps() const { return steps_; }
  // "exp_avg.<name>" and "exp_avg_sq.<name>" for every parameter.
  std::map<std::string, at::Tensor> state() const;
  // Throws CorruptInput naming the missing tensor or the shape that differs.
  void load_state(const std::map<std::string, at::Tensor>& state, int64_t steps);

 private:
  struct Slot {
    std::string name;
    at::Tensor param, exp_avg, exp_avg_sq;
  };
  std::vector<Slot> slots_;
  AdamOptions options_;
  int64_t steps_ = 0;
};

}  // namespace lockstep::train
