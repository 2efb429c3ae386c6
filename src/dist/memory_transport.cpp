#include "memory_transport.h"

#include <torch/torch.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>

#include "lockstep/core/error.h"

namespace lockstep::dist {

enum class MemoryOp { AllReduce, AllGather, Broadcast, Gather };

// The k-th operation of every rank: each rank leaves a copy of its input; the last one to arrive
// computes every rank's result.
struct Slot {
  MemoryOp op = MemoryOp::AllReduce;
  ReduceOp reduce = ReduceOp::Sum;
  int root = 0;
  std::vector<at::Tensor> inputs;  // per rank
  int arrived = 0;
  int collected = 0;
  bool done = false;
  std::optional<std::string> error;
  std::vector<at::Tensor> results;  // all_reduce/broadcast: one shared result; (all_)gather: inputs
};

class MemoryWorld {
 public:
  explicit MemoryWorld(int size) : size_(size) {}
  int size() const { return size_; }

  // Registers rank's input for its `k`-th operation; returns the slot to wait on.
  void arrive(uint64_t k, int rank, MemoryOp op, ReduceOp reduce, int root, const at::Tensor& input) {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& slot = slots_[k];
    if (slot.inputs.empty()) {
      slot.inputs.resize(size_);
      slot.op = op;
      slot.reduce = reduce;
      slot.root = root;
    }
    slot.inputs[rank] = input.detach().clone();
    if (slot.op != op || slot.reduce != reduce || slot.root != root || !same_layout(slot, input)) {
      slot.error = detail::concat("in-memory transport: operation ", k, " differs between ranks (rank ", rank,
                                  " passed ", input.sizes(), " ", input.scalar_type(), ")");
    }
    if (++slot.arrived == size_) {
      if (!slot.error) compute(slot);
      slot.done = true;
      changed_.notify_all();
    }
  }

  // Waits up to `slice` for operation k; true when done (results copied into `outputs`).
  bool collect(uint64_t k, std::chrono::milliseconds slice, const std::function<void(const Slot&)>& take) {
    std::unique_lock<std::mutex> lock(mutex_);
    Slot& slot = slots_.at(k);
    if (!changed_.wait_for(lock, slice, [&] { return slot.done; })) return false;
    const std::optional<std::string> error = slot.error;
    if (!error) take(slot);
    if (++slot.collected == size_) slots_.erase(k);
    if (error) throw Error(*error);
    return true;
  }

 private:
  bool same_layout(const Slot& slot, const at::Tensor& input) const {
    for (const auto& t : slot.inputs) {
      if (t.defined() && (!t.sizes().equals(input.sizes()) || t.scalar_type() != input.scalar_type())) return false;
    }
    return true;
  }

  static void compute(Slot& slot) {
    switch (slot.op) {
      case MemoryOp::AllReduce: {
        at::Tensor acc = slot.inputs[0].clone();
        for (size_t r = 1; r < slot.inputs.size(); ++r) {
          const at::Tensor& x = slot.inputs[r];
          switch (slot.reduce) {
            case ReduceOp::Sum:
              acc.add_(x);
              break;
            case ReduceOp::Max:
              acc = torch::maximum(acc, x);
              break;
            case ReduceOp::Min:
              acc = torch::minimum(acc, x);
              break;
          }
        }
        slot.results = {acc};
        break;
      }
      case MemoryOp::Broadcast:
        slot.results = {slot.inputs[slot.root]};
        break;
      case MemoryOp::AllGather:
      case MemoryOp::Gather:
        slot.results = slot.inputs;
        break;
    }
  }

  const int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, Slot> slots_;
};

namespace {

class MemoryWork final : public TransportWork {
 public:
  MemoryWork(std::shared_ptr<MemoryWorld> world, uint64_t k, std::function<void(const Slot&)> take)
      : world_(std::move(world)), k_(k), take_(std::move(take)) {}
  bool wait_for(std::chrono::milliseconds slice) override {
    if (done_) return true;
    done_ = world_->collect(k_, slice, take_);
    return done_;
  }

 private:
  std::shared_ptr<MemoryWorld> world_;
  uint64_t k_;
  std::function<void(const Slot&)> take_;
  bool done_ = false;
};

class MemoryTransport final : public Transport {
 public:
  MemoryTransport(std::shared_ptr<MemoryWorld> world, int rank) : world_(std::move(world)), rank_(rank) {}
  const char* name() const override { return "in-memory"; }
  bool carries(const c10::Device& device) const override { return device.is_cpu(); }

  std::unique_ptr<TransportWork> all_reduce(at::Tensor& buffer, ReduceOp op) override {
    const uint64_t k = next_++;
    world_->arrive(k, rank_, MemoryOp::AllReduce, op, 0, buffer);
    return std::make_unique<MemoryWork>(world_, k, [buffer](const Slot& s) mutable { buffer.copy_(s.results[0]); });
  }

  std::unique_ptr<TransportWork> all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) override {
    return gather_into(MemoryOp::AllGather, outputs, input, 0);
  }

  std::unique_ptr<TransportWork> broadcast(at::Tensor& buffer, int root) override {
    const uint64_t k = next_++;
    world_->arrive(k, rank_, MemoryOp::Broadcast, ReduceOp::Sum, root, buffer);
    return std::make_unique<MemoryWork>(world_, k, [buffer](const Slot& s) mutable { buffer.copy_(s.results[0]); });
  }

  std::unique_ptr<TransportWork> gather(std::vector<at::Tensor>& outputs, const at::Tensor& input, int root) override {
    return gather_into(MemoryOp::Gather, outputs, input, root);
  }

 private:
  // Every rank's input into `outputs` (none on a gather's other ranks), in rank order.
  std::unique_ptr<TransportWork> gather_into(MemoryOp op, std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                             int root) {
    const uint64_t k = next_++;
    world_->arrive(k, rank_, op, ReduceOp::Sum, root, input);
    return std::make_unique<MemoryWork>(world_, k, [outputs](const Slot& s) mutable {
      for (size_t r = 0; r < outputs.size(); ++r) outputs[r].copy_(s.results[r]);
    });
  }

  std::shared_ptr<MemoryWorld> world_;
  int rank_;
  uint64_t next_ = 0;  // this rank's operations so far: the k-th pairs with every rank's k-th
};

}  // namespace

std::vector<std::unique_ptr<Transport>> make_memory_transports(int size) {
  auto world = std::make_shared<MemoryWorld>(size);
  std::vector<std::unique_ptr<Transport>> transports;
  for (int r = 0; r < size; ++r) transports.push_back(std::make_unique<MemoryTransport>(world, r));
  return transports;
}

}  // namespace lockstep::dist
