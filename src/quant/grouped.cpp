#include "lockstep/quant/grouped.h"

#include <torch/torch.h>

#include <algorithm>

#include "lockstep/core/error.h"

namespace lockstep::quant {

Grouped::Grouped(std::string kind, std::vector<std::shared_ptr<Quantizer>> groups)
    : Quantizer("Grouped"), kind_(std::move(kind)), groups_(std::move(groups)) {
  LOCKSTEP_CHECK_ARG(!groups_.empty(), kind_, ": at least one group is needed");
  const int64_t d = groups_.front()->dim();
  for (size_t g = 0; g < groups_.size(); ++g) {
    LOCKSTEP_CHECK_ARG(groups_[g]->dim() == d, kind_, ": group ", g, " takes dim ", groups_[g]->dim(),
                       ", group 0 takes ", d);
    register_module("group" + std::to_string(g), groups_[g]);
    num_indices_ += groups_[g]->num_indices();
  }
  dim_ = d * static_cast<int64_t>(groups_.size());
}

bool Grouped::draws_per_item() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const auto& g) { return g->draws_per_item(); });
}

std::vector<at::Tensor> Grouped::split(const at::Tensor& x) const {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == dim_, kind_, ": expected tokens (b, n, ", dim_, "), got ", x.sizes());
  std::vector<at::Tensor> parts;
  for (const at::Tensor& part : x.split(groups_.front()->dim(), 2)) parts.push_back(part.contiguous());
  return parts;
}

QuantizerOutput Grouped::quantize(const at::Tensor& x, const QuantizeContext& ctx) {
  const std::vector<at::Tensor> parts = split(x);
  const at::Generator start = ctx.generator.defined() ? ctx.generator.clone() : at::Generator();
  at::Generator last;
  std::vector<at::Tensor> outputs, indices;
  std::vector<std::function<void(Reducer&)>> updates;
  QuantizerOutput result;
  for (size_t g = 0; g < groups_.size(); ++g) {
    QuantizeContext group_ctx = ctx;
    if (start.defined()) group_ctx.generator = last = start.clone();  // every group from the same draws
    QuantizerOutput out = groups_[g]->quantize(parts[g], group_ctx);
    outputs.push_back(out.quantized);
    indices.push_back(out.indices.reshape({x.size(0), x.size(1), groups_[g]->num_indices()}));
    for (auto& [name, loss] : out.losses) result.losses["group" + std::to_string(g) + "." + name] = loss;
    if (out.update) updates.push_back(std::move(out.update));
  }
  if (start.defined()) {  // the caller's generator advances as one group's draws did
    at::Generator caller = ctx.generator;
    caller.set_state(last.get_state());
  }
  if (!updates.empty()) {
    result.update = [updates = std::move(updates)](Reducer& reducer) {
      for (const auto& update : updates) update(reducer);
    };
  }
  result.quantized = torch::cat(outputs, 2);
  const at::Tensor all = torch::cat(indices, 2);
  result.indices = num_indices_ == 1 ? all.squeeze(2) : all;
  return result;
}

at::Tensor Grouped::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> parts = split(x);
  std::vector<at::Tensor> indices;
  for (size_t g = 0; g < groups_.size(); ++g) {
    indices.push_back(groups_[g]->encode(parts[g]).reshape({x.size(0), x.size(1), groups_[g]->num_indices()}));
  }
  const at::Tensor all = torch::cat(indices, 2);
  return num_indices_ == 1 ? all.squeeze(2) : all;
}

at::Tensor Grouped::decode(const at::Tensor& indices) {
  LOCKSTEP_CHECK_ARG(num_indices_ == 1 ? indices.dim() == 2 : (indices.dim() == 3 && indices.size(2) == num_indices_),
                     kind_, ": expected indices (b, n",
                     num_indices_ == 1 ? "" : lockstep::detail::concat(", ", num_indices_), "), got ", indices.sizes());
  const at::Tensor all = indices.reshape({indices.size(0), indices.size(1), num_indices_});
  std::vector<at::Tensor> outputs;
  int64_t offset = 0;
  for (const auto& group : groups_) {
    const int64_t m = group->num_indices();
    const at::Tensor slice = all.narrow(2, offset, m);
    offset += m;
    outputs.push_back(group->decode(m == 1 ? slice.squeeze(2) : slice.contiguous()));
  }
  return torch::cat(outputs, 2);
}

std::shared_ptr<Grouped> make_grouped(const std::string& kind, int64_t groups,
                                      const std::function<std::shared_ptr<Quantizer>()>& make_group) {
  LOCKSTEP_CHECK_ARG(groups >= 1, kind, ": groups = ", groups, " must be >= 1");
  std::vector<std::shared_ptr<Quantizer>> made;
  for (int64_t g = 0; g < groups; ++g) made.push_back(make_group());
  return std::make_shared<Grouped>(kind, std::move(made));
}

}  // namespace lockstep::quant
