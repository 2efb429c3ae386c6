// A Reducer for tests: records every call (its tag, in order) and acts as a single holder of the
// batch, or, with `other` set, as a two-holder sum whose other holder contributed `other`.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "lockstep/quant/reduce.h"

namespace lockstep::quant::test_util {

class RecordingReducer final : public Reducer {
 public:
  void sum_(std::vector<at::Tensor>& tensors, const CallSite& site) override {
    tags.emplace_back(site.tag);
    files.emplace_back(site.file);
    first_totals.push_back(tensors.at(0).sum().item<double>());
  }
  at::Tensor sum(const at::Tensor& local, const CallSite& site) override {
    tags.emplace_back(site.tag);
    files.emplace_back(site.file);
    ++differentiable_calls;
    last_local = local.detach().clone();
    return other.defined() ? local + other : local;
  }

  at::Tensor gather(const at::Tensor& local, const CallSite& site) override {
    tags.emplace_back(site.tag);
    files.emplace_back(site.file);
    return local;
  }

  std::vector<std::string> tags;     // every call, in order
  std::vector<std::string> files;    // the source file each call names
  std::vector<double> first_totals;  // sum_: the sum of the first tensor, as handed in
  int differentiable_calls = 0;
  at::Tensor last_local;  // sum: the last local value
  at::Tensor other;       // sum: added to the local value when defined
};

}  // namespace lockstep::quant::test_util
