// Which collective every rank expects next, from the calls the ranks agreed on, so that a repeated
// call is checked without the exchange that would cost it a host-side wait (docs/distributed.md,
// "Predicted checks"). A training loop repeats its collectives step after step
// (DDP's buckets, the trainer's reductions); once the agreed calls repeat with a period, each rank
// checks its next call against the one the period predicts, locally, instead of exchanging
// fingerprints. Every rank records the same agreed calls, so every rank predicts the same call.
// Pure bookkeeping, no communication. Internal to src/dist.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "lockstep/dist/collective.h"

namespace lockstep::dist {

class Predictor {
 public:
  using Fingerprint = std::array<int64_t, CollectiveCall::kWords>;
  // Periods up to this many calls are found (a DDP step of up to ~100 buckets and other collectives).
  static constexpr size_t kMaxPeriod = 128;
  // A period is trusted once the calls have repeated it for a whole period and for at least this many
  // calls: four equal buckets and another call are not mistaken for a period of one.
  static constexpr size_t kMinRun = 8;

  // The fingerprint of the call every rank expects as collective `sequence`, when the agreed calls
  // repeat and the one they predict may be checked locally (its waiter watches it, and it is not a
  // barrier, whose exchange is its synchronisation); else none.
  std::optional<Fingerprint> expect(uint64_t sequence) const;
  // A call every rank agreed on (by an exchange, or by matching the prediction), in the agreed order.
  void record(const Fingerprint& agreed);

 private:
  // Fingerprints equal but for the sequence number and the phase's step.
  static bool same_call(const Fingerprint& a, const Fingerprint& b);
  const Fingerprint& back(size_t age) const;  // age 0: the latest recorded

  std::vector<Fingerprint> ring_ = std::vector<Fingerprint>(kMaxPeriod + 1);  // the latest, and kMaxPeriod before
  uint64_t recorded_ = 0;
  // Per period p (index p - 1): how many of the latest calls equal the call p before them, and by how
  // much their phase's step moved over those p calls (the same for the whole run).
  std::array<uint64_t, kMaxPeriod> run_{};
  std::array<int64_t, kMaxPeriod> step_delta_{};
};

}  // namespace lockstep::dist
