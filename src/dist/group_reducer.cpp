#include "lockstep/dist/group_reducer.h"

#include <torch/torch.h>

namespace lockstep::dist {
namespace {

struct GlobalSum : public torch::autograd::Function<GlobalSum> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local, Group* group,
                            const char* tag) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["tag"] = std::string(tag) + ".backward";
    std::vector<at::Tensor> t{local.detach().clone()};
    group->all_reduce(t, ReduceOp::Sum, CallSite{tag, __FILE__, __LINE__});
    return t[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    // The tag must outlive the call; the saved string does.
    const std::string& tag = ctx->saved_data["tag"].toStringRef();
    std::vector<at::Tensor> t{grads[0].contiguous().clone()};
    group->all_reduce(t, ReduceOp::Sum, CallSite{tag.c_str(), __FILE__, __LINE__});
    return {t[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void GroupReducer::sum_(std::vector<at::Tensor>& tensors, const char* tag) {
  group_->all_reduce(tensors, ReduceOp::Sum, CallSite{tag, __FILE__, __LINE__});
}

at::Tensor GroupReducer::sum(const at::Tensor& local, const char* tag) {
  return GlobalSum::apply(local, group_.get(), tag);
}

}  // namespace lockstep::dist
