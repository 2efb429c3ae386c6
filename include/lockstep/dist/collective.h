// What one collective call is, as the checked channel (G1) sees it: sequence number, op, reduce
// op, root, dtypes, shapes and call site. Ranks exchange a fixed-size fingerprint of it before any
// data moves, so that a disagreement becomes an error on every rank instead of a backend abort, a
// hang or a silently wrong sum.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/dist/group.h"

namespace lockstep::dist {

// Foreign: a collective that another library runs on its own process group (torch.distributed's,
// checked through lockstep.distributed); CollectiveCall::foreign names it.
enum class CollectiveOp { AllReduce = 1, AllGather = 2, Broadcast = 3, Barrier = 4, Foreign = 5 };
const char* collective_op_name(CollectiveOp op);

struct TensorSpec {
  std::string dtype;  // "float32"; "float32 on cuda" off the CPU
  std::vector<int64_t> sizes;
};

struct CollectiveCall {
  uint64_t sequence = 0;  // 1 for the group's first collective
  CollectiveOp op = CollectiveOp::Barrier;
  ReduceOp reduce = ReduceOp::Sum;  // all_reduce only
  int root = -1;                    // broadcast only
  std::vector<TensorSpec> tensors;
  CallSite site;
  Phase phase;               // as the caller declared it on the group
  std::string foreign;       // Foreign only: the op as its library names it, "all_reduce(avg)", "gather(root 0)"
  bool compare_site = true;  // the call site's tag is part of the fingerprint (foreign calls may opt out)
  // Whether whoever waits for the collective watches it through the channel (CheckedGroup::finish), so
  // that its check may pass on a prediction (predictor.h). Part of the fingerprint: every rank agrees.
  bool watched = true;
  bool predicted = false;  // its check passed on a prediction, with no exchange (not in the fingerprint)

  static CollectiveCall of(uint64_t sequence, CollectiveOp op, const std::vector<at::Tensor>& tensors,
                           const CallSite& site, const Phase& phase, ReduceOp reduce = ReduceOp::Sum, int root = -1);

  // "#7 all_reduce(sum) of [float32 (512), float32 (512, 64)] at vq.ema (src/quant/vq.cpp:230) in
  // train step 8"
  std::string describe() const;

  static constexpr size_t kWords = 10;
  // Everything ranks must agree on, as fixed-size words: equal fingerprints mean the calls match
  // (up to 64-bit hash collisions of the shapes and the call-site tag; file and line may differ).
  std::array<int64_t, kWords> fingerprint() const;
  // From a fingerprint's op word (its third): whether the call is watched.
  static bool watched_word(int64_t op_word) { return (static_cast<uint64_t>(op_word) & kUnwatchedBit) == 0; }
  static constexpr uint64_t kUnwatchedBit = uint64_t{1} << 62;
};

// Checks a collective that another library is about to run on its own process group (a torch.distributed
// call, through lockstep.distributed): the ranks agree on `op` (as foreign), the tensors' dtypes and
// shapes and the call site's tag before any data moves (G1), and a rank that died or stalled is named
// (G2). Nothing is transferred. Every rank of `group` must call it; a group of one process checks nothing.
// `compare_site`: whether ranks must also agree on the call site's tag (it is reported either way).
void check_foreign_collective(Group& group, const std::string& op, const std::vector<at::Tensor>& tensors,
                              const CollectiveOptions& opts, bool compare_site);

// Ranks disagree about a collective. Every rank of the group throws it for the same collective,
// naming each rank's call.
class CollectiveMismatch : public Error {
 public:
  // `pending`: the ranks whose call matched the repeating calls' prediction had issued it (docs/distributed.md,
  // "Predicted checks"); it can never complete, so the group is unusable.
  CollectiveMismatch(int rank, std::vector<std::string> per_rank, bool pending = false);
  const std::vector<std::string>& per_rank() const { return per_rank_; }  // describe() of each rank's call

 private:
  std::vector<std::string> per_rank_;
};

// A collective (or the meeting of the ranks) could not complete for a reason other than
// disagreement. The group is unusable afterwards; the last checkpoint is intact, so resuming the
// run may succeed. Callers that need to know why catch the subclasses.
class CollectiveFailure : public Error {
 public:
  using Error::Error;
};

// Ranks of the group died (their heartbeats stopped or their processes are gone) while this rank
// waited for them in a collective.
class PeerLost : public CollectiveFailure {
 public:
  PeerLost(const std::string& message, std::vector<int> ranks) : CollectiveFailure(message), ranks_(std::move(ranks)) {}
  const std::vector<int>& ranks() const { return ranks_; }  // the ranks that died

 private:
  std::vector<int> ranks_;
};

// A collective did not finish within its timeout, counted from the last progress any rank
// published: a rank is stalled (stopped, deadlocked, or on a host that vanished without a word).
class CollectiveTimeout : public CollectiveFailure {
 public:
  CollectiveTimeout(const std::string& message, std::vector<int> waiting_for)
      : CollectiveFailure(message), waiting_for_(std::move(waiting_for)) {}
  const std::vector<int>& waiting_for() const { return waiting_for_; }  // ranks that never arrived; may be empty

 private:
  std::vector<int> waiting_for_;
};

// Ranks that must hold the same thing do not: the model replicas after a step, or the data plan of
// an epoch (another folder on one node). Every rank throws it; resuming will not help until the
// cause is fixed.
class ReplicaDivergence : public Error {
 public:
  ReplicaDivergence(const std::string& message, std::vector<int> ranks) : Error(message), ranks_(std::move(ranks)) {}
  const std::vector<int>& ranks() const { return ranks_; }  // the ranks that differ from rank 0

 private:
  std::vector<int> ranks_;
};

}  // namespace lockstep::dist
