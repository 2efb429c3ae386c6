// Sums float tensors held in pieces over the ranks of a group to the same bits however the pieces
// are split among the ranks and in whatever order they are added (train.shard_size, G4 over whole
// runs). Each piece is rounded once to int64 fixed point on a per-tensor scale that every rank
// derives from one all-reduce of maxima (a quantum of about 2^-58 of the tensor's largest value over
// all pieces); int64 sums are exact, so the result depends only on the set of pieces, and is
// rounded back to float32 once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/group.h"

namespace lockstep::dist {

class ExactSum {
 public:
  // `shapes`: the tensors of every piece, on `device`. `most_pieces`: an upper bound of the pieces
  // of all ranks together, which the scale leaves room for (InvalidArgument when add() passes it).
  ExactSum(std::shared_ptr<Group> group, std::vector<std::vector<int64_t>> shapes, int64_t most_pieces,
           at::Device device = at::kCPU);

  // One piece: a tensor per shape (an undefined one counts as zeros). Copied, so `piece` may change.
  void add(const std::vector<at::Tensor>& piece);
  int64_t pieces() const { return static_cast<int64_t>(pieces_.size()); }

  // The sum over every rank's pieces, float32, one tensor per shape, on the device;
  // collective: an all-reduce of the maxima (tag `site.tag` + ".scale"), then one of the int64 sums
  // (`site`). Every rank calls it, with pieces or none. A tensor with a value that
  // is not finite in any piece sums to NaN everywhere. Clears the pieces.
  std::vector<at::Tensor> finish(const CallSite& site);

 private:
  std::shared_ptr<Group> group_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_;  // of each tensor in a flat piece; the last one is the total
  int64_t most_pieces_;
  at::TensorOptions on_;            // float32 on the device
  at::Tensor tensor_of_;            // int64: which tensor each value of a flat piece belongs to
  std::vector<at::Tensor> pieces_;  // flat float32
  std::string scale_tag_;           // the maxima's call site tag, alive during the call
};

}  // namespace lockstep::dist
