// The code choices of one quantizer call, kept so that a second pass over the same call takes them
// instead of searching again: torch.compile's forward computes values only, and its backward rebuilds
// the graph to differentiate it (python/lockstep/_ops.py). The search is the costly part of that
// rebuild, and its result must be the forward's even when a codebook changed in between.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace lockstep::quant {

struct QuantizeContext;

class SearchLog {
 public:
  // A log that records each choice as the call makes it.
  SearchLog() = default;
  // A log that hands back, in order, the choices a recording pass made (`recorded()` of it).
  explicit SearchLog(at::Tensor recorded);

  bool replaying() const { return replaying_; }

  // The int64 choice of shape `shape` that `search` computes: run and recorded, or the next one of
  // the record (InvalidArgument when the record has too few: the pass differs from the recorded one).
  at::Tensor choose(at::IntArrayRef shape, const std::function<at::Tensor()>& search);

  // Every choice recorded so far, flattened into one int64 tensor of its own storage (a copy, never a
  // view of a choice; empty on the CPU when none).
  at::Tensor recorded() const;

  // InvalidArgument unless a replay took the whole record.
  void check_all_taken() const;

 private:
  bool replaying_ = false;
  std::vector<at::Tensor> choices_;  // recording: each choice, flattened
  at::Tensor record_;                // replaying: the record, and how much of it was taken
  int64_t taken_ = 0;
};

// `search()` itself when the call keeps no log, else the log's choice.
at::Tensor choose_codes(const QuantizeContext& ctx, at::IntArrayRef shape, const std::function<at::Tensor()>& search);

}  // namespace lockstep::quant
