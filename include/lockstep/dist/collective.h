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

enum class CollectiveOp { AllReduce = 1, AllGather = 2, Broadcast = 3, Barrier = 4 };
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
  Phase phase;  // as the caller declared it on the group

  static CollectiveCall of(uint64_t sequence, CollectiveOp op, const std::vector<at::Tensor>& tensors,
                           const CallSite& site, const Phase& phase, ReduceOp reduce = ReduceOp::Sum,
                           int root = -1);

  // "#7 all_reduce(sum) of [float32 (512), float32 (512, 64)] at vq.ema (src/quant/vq.cpp:230) in
  // train step 8"
  std::string describe() const;

  static constexpr size_t kWords = 10;
  // Everything ranks must agree on, as fixed-size words: equal fingerprints mean the calls match
  // (up to 64-bit hash collisions of the shapes and the call-site tag; file and line may differ).
  std::array<int64_t, kWords> fingerprint() const;
};

// Ranks disagree about a collective. Every rank of the group throws it for the same collective,
// naming each rank's call.
class CollectiveMismatch : public Error {
 public:
  CollectiveMismatch(int rank, std::vector<std::string> per_rank);
  const std::vector<std::string>& per_rank() const { return per_rank_; }  // describe() of each rank's call

 private:
  std::vector<std::string> per_rank_;
};

// A collective failed for a reason other than disagreement: a peer died or the timeout expired.
class CollectiveFailure : public Error {
 public:
  using Error::Error;
};

}  // namespace lockstep::dist
