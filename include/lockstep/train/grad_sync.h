// Data-parallel gradient averaging in buckets that are all-reduced while backward still runs (as
// DDP does): each parameter's gradient is copied into its bucket as autograd produces it, and a
// bucket whose parameters are all in goes out at once; finish() waits for them all.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/group.h"

namespace lockstep::train {

class GradientSync {
 public:
  // Buckets of at most `bucket_bytes` (one parameter may exceed it alone), filled in reverse
  // parameter order, the order backward produces gradients in. Registers a hook on each parameter.
  // `tag` names the buckets' collectives ("<tag>.bucketN"), so two models' syncs never pair.
  GradientSync(std::shared_ptr<dist::Group> group, std::vector<at::Tensor> parameters, int64_t bucket_bytes,
               const std::string& tag = "train.grads");
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Call before backward: `control` (float32, 1-D) travels summed over ranks in the last bucket.
  void begin(const at::Tensor& control);
  // Gradient accumulation: `backward_passes` backwards before finish(), their gradients summed;
  // buckets go out during the last one. set_control() must come before that last pass.
  void begin_accumulation(int64_t backward_passes);
  void set_control(const at::Tensor& control);

  // While one lives, gradients the hooks see are not the step's: torch::autograd::grad over a
  // parameter (VQGAN's adaptive weight) runs its hooks too.
  class Paused {
   public:
    explicit Paused(GradientSync& sync);
    ~Paused();
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    GradientSync& sync_;
    bool was_active_;
  };
  // Call after backward: sends what has not gone yet (parameters that got no gradient count as
  // zero on this rank), waits, and leaves every parameter's .grad the mean over ranks. Returns the
  // control tensor summed over ranks.
  at::Tensor finish();

  int64_t buckets() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // the parameters' hooks hold it weakly
};

}  // namespace lockstep::train
