#include "predictor.h"

#include <algorithm>

namespace lockstep::dist {
namespace {

// The words of CollectiveCall::fingerprint() that move from one repetition to the next.
constexpr size_t kSequenceWord = 1;
constexpr size_t kOpWord = 2;
constexpr size_t kStepWord = 9;

}  // namespace

bool Predictor::same_call(const Fingerprint& a, const Fingerprint& b) {
  for (size_t w = 0; w < a.size(); ++w) {
    if (w != kSequenceWord && w != kStepWord && a[w] != b[w]) return false;
  }
  return true;
}

const Predictor::Fingerprint& Predictor::back(size_t age) const { return ring_[(recorded_ - 1 - age) % ring_.size()]; }

void Predictor::record(const Fingerprint& agreed) {
  ring_[recorded_ % ring_.size()] = agreed;
  ++recorded_;
  for (size_t p = 1; p <= kMaxPeriod; ++p) {
    uint64_t& run = run_[p - 1];
    if (recorded_ <= p || !same_call(agreed, back(p))) {
      run = 0;
      continue;
    }
    const int64_t delta = agreed[kStepWord] - back(p)[kStepWord];
    run = run > 0 && delta == step_delta_[p - 1] ? run + 1 : 1;
    step_delta_[p - 1] = delta;
  }
}

// Of the trusted periods, the one with the longest run: a step of 4 equal buckets and a fifth call
// repeats with period 5 for as long as it runs, with period 1 only within a step. A longer period
// that is not trusted yet (a call that broke a run of equal ones seen again one period later) does not
// hide a shorter one that is.
std::optional<Predictor::Fingerprint> Predictor::expect(uint64_t sequence) const {
  size_t best = 0;
  for (size_t p = 1; p <= kMaxPeriod; ++p) {
    const bool trusted = run_[p - 1] >= std::max<uint64_t>(p, kMinRun);
    if (trusted && (best == 0 || run_[p - 1] > run_[best - 1])) best = p;
  }
  if (best == 0) return std::nullopt;
  Fingerprint next = back(best - 1);
  if (!CollectiveCall::watched_word(next[kOpWord])) return std::nullopt;
  // A barrier's exchange is the barrier itself (a gather and a tree broadcast from 3 ranks): checking it
  // costs nothing, and without it a barrier would be an all_reduce over the ring.
  if (next[kOpWord] == static_cast<int64_t>(CollectiveOp::Barrier)) return std::nullopt;
  next[kSequenceWord] = static_cast<int64_t>(sequence);
  next[kStepWord] += step_delta_[best - 1];
  return next;
}

}  // namespace lockstep::dist
