#include "lockstep/dist/group.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "unknown";
}

std::string Phase::describe() const {
  switch (kind) {
    case Kind::TrainStep:
      return detail::concat("train step ", step);
    case Kind::Evaluation:
      return detail::concat("evaluation after step ", step);
    case Kind::None:
      break;
  }
  return "no declared phase";
}

void Group::set_phase(const Phase& phase) {
  std::lock_guard<std::mutex> lock(phase_mutex_);
  phase_ = phase;
}

Phase Group::phase() const {
  std::lock_guard<std::mutex> lock(phase_mutex_);
  return phase_;
}

namespace {
class Done final : public PendingCollective {
 public:
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingCollective> Group::all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op,
                                                           const CollectiveOptions& opts) {
  all_reduce(tensors, op, opts);
  return std::make_unique<Done>();
}

namespace {
void check_defined(const std::vector<at::Tensor>& tensors, const char* op, const CollectiveOptions& opts) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOCKSTEP_CHECK_ARG(tensors[i].defined(), op, " at ", opts.site.to_string(), ": tensor ", i, " is undefined");
  }
}
}  // namespace

void SingleProcessGroup::all_reduce(std::vector<at::Tensor>& tensors, ReduceOp, const CollectiveOptions& opts) {
  check_defined(tensors, "all_reduce", opts);
}

std::vector<at::Tensor> SingleProcessGroup::all_gather(const at::Tensor& input, const CollectiveOptions& opts) {
  check_defined({input}, "all_gather", opts);
  return {input.clone()};
}

void SingleProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root, const CollectiveOptions& opts) {
  check_defined(tensors, "broadcast", opts);
  LOCKSTEP_CHECK_ARG(root == 0, "broadcast at ", opts.site.to_string(), ": root ", root,
                     " is not a rank of a group of size 1");
}

void SingleProcessGroup::barrier(const CollectiveOptions&) {}

std::shared_ptr<Group> make_single_process_group() { return std::make_shared<SingleProcessGroup>(); }

}  // namespace lockstep::dist
