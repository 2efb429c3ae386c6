#include "lockstep/dist/backward_reducer.h"

#include "lockstep/core/error.h"

#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>

#include "checked_group.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/existing_group.h"
#include "lockstep/dist/group_reducer.h"

namespace lockstep::dist {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a node keeps for its backward; held in autograd's saved data as a capsule.
struct SumInBackwardState : torch::CustomClassHolder {
  std::shared_ptr<LazyGroup> group;
  std::function<at::Tensor(const at::Tensor&)> f;
  Phase phase;
  std::string tag, file;  // the call site's strings, owned here: the backward runs after the caller returns
  int line = 0;
};

struct SumInBackward : public torch::autograd::Function<SumInBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local,
                            c10::intrusive_ptr<SumInBackwardState> state) {
    ctx->save_for_backward({local});
    at::Tensor value;
    {
      torch::NoGradGuard no_grad;
      value = state->f(local.detach());
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return value;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto state = c10::static_intrusive_pointer_cast<SumInBackwardState>(ctx->saved_data["state"].toCapsule());
    const at::Tensor local = ctx->get_saved_variables()[0];
    const at::Tensor grad = grads[0].defined() ? grads[0] : torch::zeros({}, local.options());
    const int64_t n = local.numel();
    // One collective: the global sum of the statistics and of the incoming gradients.
    std::vector<at::Tensor> packed{
        torch::cat({local.detach().reshape(-1), grad.detach().reshape(-1).to(local.dtype())})};
    try {
      const CallSite site{state->tag.c_str(), state->file.c_str(), state->line};
      const std::shared_ptr<Group> group = state->group->get(site);
      const PhaseScope phase(*group, state->phase);
      group->all_reduce(packed, ReduceOp::Sum, CallSite{state->tag.c_str(), state->file.c_str(), state->line});
    } catch (...) {
      state->group->rethrow(std::current_exception());
    }
    at::Tensor global = packed[0].narrow(0, 0, n).reshape(local.sizes()).requires_grad_(true);
    const at::Tensor grad_sum = packed[0].narrow(0, n, grad.numel()).reshape(grad.sizes());
    at::Tensor value;
    {
      torch::AutoGradMode enabled(true);
      value = state->f(global);
    }
    const auto local_grad = torch::autograd::grad({value}, {global}, {grad_sum.to(value.dtype())},
                                                  /*retain_graph=*/false, /*create_graph=*/false,
                                                  /*allow_unused=*/true)[0];
    return {local_grad.defined() ? local_grad : torch::zeros_like(local), at::Tensor()};
  }
};

struct UpdateState : torch::CustomClassHolder {
  std::function<void()> update;
};

struct RunOnBackward : public torch::autograd::Function<RunOnBackward> {
  static variable_list forward(AutogradContext* ctx, at::TensorList tensors, c10::intrusive_ptr<UpdateState> state) {
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    ctx->saved_data["count"] = static_cast<int64_t>(tensors.size());
    variable_list out;
    // Copies, not views: a custom function's view may not be modified in place, and callers do.
    for (const auto& t : tensors) out.push_back(t.clone());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto state = c10::static_intrusive_pointer_cast<UpdateState>(ctx->saved_data["state"].toCapsule());
    if (state->update) {
      torch::NoGradGuard no_grad;
      auto update = std::move(state->update);  // once, even when backward runs again (retain_graph)
      state->update = nullptr;
      update();
    }
    grads.emplace_back();  // for the state argument
    return grads;
  }
};

// The channels this process made under each prefix so far (LazyGroupOptions::numbered).
int64_t next_channel_number(const std::string& prefix) {
  static std::mutex mutex;
  static std::map<std::string, int64_t> made;
  std::lock_guard<std::mutex> lock(mutex);
  return ++made[prefix];
}

}  // namespace

LazyGroup::LazyGroup(c10::intrusive_ptr<c10d::ProcessGroup> process_group, c10::intrusive_ptr<c10d::Store> store,
                     LazyGroupOptions options)
    : options_(std::move(options)),
      process_group_(std::move(process_group)),
      store_(std::move(store)),
      rank_(process_group_->getRank()),
      size_(process_group_->getSize()) {
  LOCKSTEP_CHECK_ARG(!options_.prefix.empty(), "LazyGroup: no store prefix given (it names the channel on every rank)");
}

void LazyGroup::check_then(const std::string& op, const std::vector<at::Tensor>& tensors, const std::string& tag,
                           const std::string& file, int line, bool compare_site,
                           std::function<void(std::exception_ptr)> then) {
  const CallSite site{tag.c_str(), file.c_str(), line};
  const std::shared_ptr<Group> group = get(site);
  if (auto* checked = dynamic_cast<CheckedGroup*>(group.get())) {
    checked->check_foreign_then(op, tensors, tag, file, line, compare_site, std::move(then));
    return;
  }
  std::exception_ptr error;  // a group of one process: nothing to agree with, nothing to wait for
  try {
    check_foreign_collective(*group, op, tensors, CollectiveOptions(site), compare_site);
  } catch (...) {
    error = std::current_exception();
  }
  then(error);
}

std::shared_ptr<Group> LazyGroup::get(const CallSite& first_use) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!group_) {
    ExistingGroupOptions options;
    options.prefix = options_.prefix;
    std::string identity = options_.identity;
    if (options_.numbered) {
      const int64_t n = next_channel_number(options_.prefix);
      options.prefix += "/" + std::to_string(n);
      identity += detail::concat(", channel ", n);
    }
    options.timeout = options_.timeout;
    options.make_gloo = options_.make_gloo;
    options.own_gloo = options_.own_gloo;
    options.predict = options_.predict;
    options.name = identity;
    options.global_ranks = options_.global_ranks;
    std::shared_ptr<Group> group = make_group_over(process_group_, store_, options);
    if (!options_.identity.empty()) {
      // The op's name carries the identity: ranks with different views disagree on the fingerprint.
      check_foreign_collective(*group, "join " + identity, {}, CollectiveOptions(first_use), /*compare_site=*/false);
    }
    group_ = std::move(group);
  }
  return group_;
}

void LazyGroup::rethrow(std::exception_ptr e) const {
  if (translate_) translate_(e);
  std::rethrow_exception(e);
}

void BackwardReducer::sum_(std::vector<at::Tensor>& tensors, const CallSite& site) {
  const std::shared_ptr<Group> group = group_->get(site);
  const PhaseScope phase(*group, phase_);
  GroupReducer(group).sum_(tensors, site);
}

at::Tensor BackwardReducer::sum(const at::Tensor& local, const CallSite& site) {
  const std::shared_ptr<Group> group = group_->get(site);
  const PhaseScope phase(*group, phase_);
  return GroupReducer(group).sum(local, site);
}

at::Tensor BackwardReducer::gather(const at::Tensor& local, const CallSite& site) {
  const std::shared_ptr<Group> group = group_->get(site);
  const PhaseScope phase(*group, phase_);
  return GroupReducer(group).gather(local, site);
}

at::Tensor BackwardReducer::apply_to_sum(const at::Tensor& local, const std::function<at::Tensor(const at::Tensor&)>& f,
                                         const CallSite& site) {
  if (!at::GradMode::is_enabled()) return f(local);  // nothing will be backwarded: no collective ever
  // The node joins the graph even when `local` needs no gradient, so every rank's backward reaches it.
  auto state = c10::make_intrusive<SumInBackwardState>();
  state->group = group_;
  state->f = f;
  state->phase = phase_;
  state->tag = site.tag;
  state->file = site.file;
  state->line = site.line;
  return SumInBackward::apply(local.requires_grad() ? local : local.detach().requires_grad_(true), std::move(state));
}

std::vector<at::Tensor> run_on_backward(const std::vector<at::Tensor>& tensors, const at::Tensor& anchor,
                                        std::function<void()> update) {
  if (!at::GradMode::is_enabled()) return tensors;
  std::vector<at::Tensor> inputs = tensors;
  inputs.push_back(anchor);
  auto state = c10::make_intrusive<UpdateState>();
  state->update = std::move(update);
  variable_list out = RunOnBackward::apply(at::TensorList(inputs), std::move(state));
  out.pop_back();
  return out;
}

}  // namespace lockstep::dist
