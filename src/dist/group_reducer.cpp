#include "lockstep/dist/group_reducer.h"

#include <torch/torch.h>

#include <string>

#include "lockstep/core/error.h"

namespace lockstep::dist {
namespace {

// What GlobalSum's backward needs after the caller returned: the group (owned), the phase the
// forward ran in (its backward collective is fingerprinted with it) and the call site's strings.
struct GlobalSumState : torch::CustomClassHolder {
  std::shared_ptr<Group> group;
  Phase phase;
  std::string tag, file;
  int line = 0;
};

struct GlobalSum : public torch::autograd::Function<GlobalSum> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            c10::intrusive_ptr<GlobalSumState> state, const CallSite* site) {
    std::vector<at::Tensor> t{local.detach().clone()};
    state->group->all_reduce(t, ReduceOp::Sum, *site);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return t[0];
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto state = c10::static_intrusive_pointer_cast<GlobalSumState>(ctx->saved_data["state"].toCapsule());
    const PhaseScope phase(*state->group, state->phase);
    std::vector<at::Tensor> t{grads[0].contiguous().clone()};
    state->group->all_reduce(t, ReduceOp::Sum, CallSite{state->tag.c_str(), state->file.c_str(), state->line});
    return {t[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void GroupReducer::require_declared_phase(const CallSite& site) const {
  if (group_->size() == 1 || group_->phase().kind != Phase::Kind::None) return;
  throw InvalidArgument(detail::concat(
      "quantizer statistics at ", site.tag, " (", site.file, ":", site.line, ") on rank ", group_->rank(), " of ",
      group_->size(),
      " are summed in no declared phase: a forward that runs on some ranks only (validation in "
      "training mode) would pair with another rank's training step and mix their data. Declare each training step "
      "with dist::PhaseScope(group, dist::Phase::train_step(k)) and an evaluation with Phase::evaluation(k)"));
}

void GroupReducer::sum_(std::vector<at::Tensor>& tensors, const CallSite& site) {
  require_declared_phase(site);
  group_->all_reduce(tensors, ReduceOp::Sum, site);
}

at::Tensor GroupReducer::gather(const at::Tensor& local, const CallSite& site) {
  require_declared_phase(site);
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
  LOCKSTEP_ASSERT(all.size() == counts.size() && static_cast<int>(all.size()) == group_->size(), "gather at ",
                  site.to_string(), " got ", all.size(), " parts and ", counts.size(), " row counts from ",
                  group_->size(), " ranks");
  std::vector<at::Tensor> parts;
  for (size_t r = 0; r < all.size(); ++r) parts.push_back(all[r].narrow(0, 0, counts[r].item<int64_t>()));
  return torch::cat(parts);
}

at::Tensor GroupReducer::sum(const at::Tensor& local, const CallSite& site) {
  require_declared_phase(site);
  auto state = c10::make_intrusive<GlobalSumState>();
  state->group = group_;
  state->phase = group_->phase();
  state->tag = std::string(site.tag) + ".backward";
  state->file = site.file;
  state->line = site.line;
  return GlobalSum::apply(local, std::move(state), &site);
}

}  // namespace lockstep::dist
