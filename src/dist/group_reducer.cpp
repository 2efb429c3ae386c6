#include "lockstep/dist/group_reducer.h"

#include <torch/torch.h>

namespace lockstep::dist {
namespace {

struct GlobalSum : public torch::autograd::Function<GlobalSum> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local, Group* group,
                            const CallSite* site) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["tag"] = std::string(site->tag) + ".backward";
    ctx->saved_data["file"] = std::string(site->file);
    ctx->saved_data["line"] = static_cast<int64_t>(site->line);
    std::vector<at::Tensor> t{local.detach().clone()};
    group->all_reduce(t, ReduceOp::Sum, *site);
    return t[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    // The tag and file must outlive the call; the saved strings do.
    const std::string& tag = ctx->saved_data["tag"].toStringRef();
    const std::string& file = ctx->saved_data["file"].toStringRef();
    std::vector<at::Tensor> t{grads[0].contiguous().clone()};
    group->all_reduce(t, ReduceOp::Sum,
                      CallSite{tag.c_str(), file.c_str(), static_cast<int>(ctx->saved_data["line"].toInt())});
    return {t[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void GroupReducer::sum_(std::vector<at::Tensor>& tensors, const CallSite& site) {
  group_->all_reduce(tensors, ReduceOp::Sum, site);
}

at::Tensor GroupReducer::gather(const at::Tensor& local, const CallSite& site) {
  const std::string rows_tag = std::string(site.tag) + ".rows";
  const auto counts = group_->all_gather(torch::tensor({local.size(0)}, torch::kInt64),
                                         CallSite{rows_tag.c_str(), site.file, site.line});
  int64_t longest = 0;
  for (const auto& c : counts) longest = std::max(longest, c.item<int64_t>());
  std::vector<int64_t> padded_shape = local.sizes().vec();
  padded_shape[0] = longest;
  at::Tensor padded = torch::zeros(padded_shape, local.options());
  padded.narrow(0, 0, local.size(0)).copy_(local);
  const auto all = group_->all_gather(padded, site);
  std::vector<at::Tensor> parts;
  for (size_t r = 0; r < all.size(); ++r) parts.push_back(all[r].narrow(0, 0, counts[r].item<int64_t>()));
  return torch::cat(parts);
}

at::Tensor GroupReducer::sum(const at::Tensor& local, const CallSite& site) {
  return GlobalSum::apply(local, group_.get(), &site);
}

}  // namespace lockstep::dist
