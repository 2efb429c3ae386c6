// Communication on backward only (G3 for the Python modules): a forward never issues a collective,
// so a forward that runs on some ranks only (a preview, validation in training mode, a no_grad pass)
// runs alone. The cross-rank reductions ride on backward, which every data-parallel rank runs.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/dist/existing_group.h"
#include "lockstep/dist/group.h"
#include "lockstep/quant/reduce.h"

namespace lockstep::dist {

struct LazyGroupOptions {
  // Where under the store the channel meets and keeps its heartbeats and statuses. It must be the same
  // on every rank of the group and differ from every other channel's on that store: derive it from
  // what the group's members agree on (its name, its ranks), never from a count kept by the process
  // alone, which ranks of different groups would share (their channels would meet and pair collectives).
  std::string prefix;
  // Appends "/<n>" to the prefix, n counting the channels this process made under that prefix, in the
  // order of their first uses: several channels over one group (a module each), which every member
  // makes in the same order (their first backwards).
  bool numbered = false;
  // This rank's description of the channel (the module, the group, its ranks), when not empty: the
  // channel's first collective compares it across ranks, so ranks that met under one prefix with
  // different views are a CollectiveMismatch on every rank at once, before any data moves.
  std::string identity;
  // The members' ranks in the whole job, in the group's order: errors name a subgroup's ranks both ways.
  std::vector<int> global_ranks;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  GlooMaker make_gloo;    // see ExistingGroupOptions::make_gloo (the Python package hands torch's Gloo over)
  bool own_gloo = false;  // see ExistingGroupOptions::own_gloo
  bool predict = true;    // see ExistingGroupOptions::predict
};

// A checked group over the caller's process group, made at its first use. Making it is a
// rendezvous, so that first use must be where every rank is (a backward), never a forward. Thread-safe.
class LazyGroup {
 public:
  LazyGroup(c10::intrusive_ptr<c10d::ProcessGroup> process_group, c10::intrusive_ptr<c10d::Store> store,
            LazyGroupOptions options);
  int rank() const { return rank_; }  // known without communicating
  int size() const { return size_; }
  // The channel, made at the first call: `first_use` (the collective that needs it) is the site its
  // first collective (the identity's comparison) reports, so that a rank left waiting there names it.
  std::shared_ptr<Group> get(const CallSite& first_use = LOCKSTEP_CALL_SITE("the channel's first use"));

  // check_foreign_collective (collective.h) off the caller's thread, for lockstep.distributed's collectives:
  // returns at once; the check runs on the channel's worker after every collective submitted before it,
  // then `then(error)` runs there, before any later one (error null when every rank agreed). `then`
  // issues the checked collective on the wrapped group, so that every rank issues it in the same order.
  void check_then(const std::string& op, const std::vector<at::Tensor>& tensors, const std::string& tag,
                  const std::string& file, int line, bool compare_site, std::function<void(std::exception_ptr)> then);

  // Backward runs inside torch's autograd engine, which hands an exception to Python as RuntimeError
  // unless the exception names its Python type: the bindings translate ours (CollectiveMismatch...).
  void set_error_translator(std::function<void(std::exception_ptr)> translate) { translate_ = std::move(translate); }
  // Rethrows `e` through the translator when there is one, else as it is.
  [[noreturn]] void rethrow(std::exception_ptr e) const;

 private:
  std::function<void(std::exception_ptr)> translate_;
  LazyGroupOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroup> process_group_;
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::mutex mutex_;
  std::shared_ptr<Group> group_;
};

// The reducer of the Python modules' training forwards. apply_to_sum returns f(local) at once and
// reduces in backward: one all_reduce of (local, incoming gradient), then `local` gets the gradient
// of f at the global sum, times the gradient summed over ranks (data-parallel averaging divides it
// again, so each rank's inputs get their single-process gradient). sum_, sum and gather communicate
// at once: only VQ's k-means initialisation calls them in a forward (docs/python/distributed.md).
class BackwardReducer final : public quant::Reducer {
 public:
  // `phase`: the training step this call belongs to, declared on the group for each of its
  // collectives (forward's and backward's), as GroupReducer requires on several ranks.
  BackwardReducer(std::shared_ptr<LazyGroup> group, const Phase& phase) : group_(std::move(group)), phase_(phase) {}

  void sum_(std::vector<at::Tensor>& tensors, const CallSite& site) override;
  at::Tensor sum(const at::Tensor& local, const CallSite& site) override;
  at::Tensor gather(const at::Tensor& local, const CallSite& site) override;
  at::Tensor apply_to_sum(const at::Tensor& local, const std::function<at::Tensor(const at::Tensor&)>& f,
                          const CallSite& site) override;

 private:
  std::shared_ptr<LazyGroup> group_;
  Phase phase_;
};

// `tensors` behind one autograd node whose backward runs `update` once, then passes every gradient
// through unchanged. `anchor` (a scalar that requires grad) puts the node in the graph even when no
// tensor requires grad. Under no_grad, the tensors come back as they are and `update` never runs.
std::vector<at::Tensor> run_on_backward(const std::vector<at::Tensor>& tensors, const at::Tensor& anchor,
                                        std::function<void()> update);

}  // namespace lockstep::dist
