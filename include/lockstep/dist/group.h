// The process group every collective in lockstep goes through. Code that may run distributed
// takes a Group and never asks "am I distributed?": on one process it gets a SingleProcessGroup,
// whose collectives are exact identities. make_process_group's groups (Gloo, NCCL, in memory)
// implement the same interface behind the checked channel.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/core/call_site.h"

namespace lockstep::dist {

enum class ReduceOp { Sum, Max, Min };
const char* reduce_op_name(ReduceOp op);

using ::lockstep::CallSite;  // core/call_site.h: a tag and the source location of a call

// Where in training the caller is when it issues collectives: a training step (which one), an
// evaluation, or nothing declared. It is part of every collective's fingerprint, so a collective
// issued from another phase on one rank (rank 0 running a training-mode forward to validate while
// rank 1 runs its next step) cannot pair with the other's: it is a CollectiveMismatch before any
// data moves, even where sequence number, op, shapes and tag all agree.
struct Phase {
  enum class Kind { None = 0, TrainStep = 1, Evaluation = 2 };
  Kind kind = Kind::None;
  int64_t step = 0;  // the training step (1-based) being taken, or after which evaluation runs

  static Phase train_step(int64_t step) { return {Kind::TrainStep, step}; }
  static Phase evaluation(int64_t after_step) { return {Kind::Evaluation, after_step}; }
  // "train step 8", "evaluation after step 8", "no declared phase"
  std::string describe() const;
  bool operator==(const Phase& o) const { return kind == o.kind && step == o.step; }
};

// Options every collective takes (gloo's style): who calls, and how long to wait at most.
struct CollectiveOptions {
  CallSite site;
  // Zero means the group's default timeout.
  std::chrono::milliseconds timeout{0};

  CollectiveOptions() = default;
  CollectiveOptions(CallSite s) : site(s) {}  // NOLINT: a call site alone is the common case
};

// A collective in flight: wait() returns when its results are in place, or throws as the
// collective would have.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Group {
 public:
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A short description for logs and errors ("single process", "gloo 2 ranks via 127.0.0.1:29500").
  virtual std::string describe() const = 0;
  // Whether collectives may pass tensors on `device`: cpu always; cuda:N only over a transport bound
  // to that device (NCCL, GroupOptions::cuda_device). A group of one process moves nothing: any.
  virtual bool carries(const c10::Device& device) const = 0;

  // In place: each tensor holds this rank's values on entry and the reduction over all ranks on
  // return. All tensors of one call are reduced together (one collective).
  virtual void all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op, const CollectiveOptions& opts) = 0;
  // Returns one tensor per rank, in rank order; every rank passes the same shape and dtype.
  virtual std::vector<at::Tensor> all_gather(const at::Tensor& input, const CollectiveOptions& opts) = 0;
  // In place: every rank's tensors receive `root`'s values.
  virtual void broadcast(std::vector<at::Tensor>& tensors, int root, const CollectiveOptions& opts) = 0;
  virtual void barrier(const CollectiveOptions& opts) = 0;
  // all_reduce that returns once the ranks agreed on the call (G1) and the data is on its way, so
  // the caller can go on computing; `tensors` must stay alive and untouched until wait(). Calls
  // must still be issued in the same order on every rank. By default it runs synchronously.
  virtual std::unique_ptr<PendingCollective> all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op,
                                                              const CollectiveOptions& opts);

  // What the caller is doing ("step 57"), shown in other ranks' reports when this rank dies or
  // stalls. Not a collective.
  virtual void set_progress(const std::string& progress) { (void)progress; }

  // The phase every later collective is fingerprinted with (see Phase); use PhaseScope.
  void set_phase(const Phase& phase);
  Phase phase() const;

 private:
  mutable std::mutex phase_mutex_;
  Phase phase_;
};

// Declares `phase` on `group` for its lifetime, then restores the one before.
class PhaseScope {
 public:
  PhaseScope(Group& group, const Phase& phase) : group_(group), previous_(group.phase()) { group.set_phase(phase); }
  ~PhaseScope() { group_.set_phase(previous_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Group& group_;
  Phase previous_;
};

// The group of one process: rank 0 of 1. Checks its arguments like a real group would, so that
// single-process tests catch calls that would be wrong on many ranks.
class SingleProcessGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "single process"; }
  bool carries(const c10::Device&) const override { return true; }
  void all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op, const CollectiveOptions& opts) override;
  std::vector<at::Tensor> all_gather(const at::Tensor& input, const CollectiveOptions& opts) override;
  void broadcast(std::vector<at::Tensor>& tensors, int root, const CollectiveOptions& opts) override;
  void barrier(const CollectiveOptions& opts) override;
};

std::shared_ptr<Group> make_single_process_group();

}  // namespace lockstep::dist
