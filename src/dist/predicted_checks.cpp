// CheckedGroup's predicted checks (predictor.h, docs/distributed.md "Predicted checks"): a call that
// matches what every rank expects next is issued with no exchange; a call that departs from it is
// settled with every rank through the store, where each rank reports what it called there.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checked_group.h"

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Every rank's report at a departure, polled from the store as a TransportWork, so that the wait
// watches the other ranks (CheckedGroup::finish): first every millisecond, then every 20.
class ReportsWork final : public TransportWork {
 public:
  ReportsWork(const Liveness& liveness, uint64_t sequence) : liveness_(liveness), sequence_(sequence) {}
  bool wait_for(std::chrono::milliseconds slice) override {
    const auto end = Clock::now() + slice;
    while (true) {
      if ((reports = liveness_.reports(sequence_))) return true;
      if (Clock::now() >= end) return false;
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(pause_, slice));
      pause_ = std::min(pause_ * 2, std::chrono::milliseconds(20));
    }
  }
  std::optional<std::vector<std::string>> reports;

 private:
  const Liveness& liveness_;
  uint64_t sequence_;
  std::chrono::milliseconds pause_{1};
};

}  // namespace

// The calls from the first on that match what every rank expects next (predictor.h): none when the
// agreed calls do not repeat or the first departs from them (depart() returns once every rank departed,
// for the exchange to decide). A rank that matches the prediction where another departed fails here.
size_t CheckedGroup::agree_on_prediction(std::vector<CollectiveCall>& calls, const CollectiveOptions& opts) {
  size_t matched = 0;
  for (; matched < calls.size(); ++matched) {
    CollectiveCall& call = calls[matched];
    Predictor::Fingerprint fingerprint;
    const Expected expected = compare_with_prediction(call, fingerprint);
    if (expected == Expected::Nothing) break;
    if (expected == Expected::Departs) {
      if (matched == 0) depart(call, opts);
      break;
    }
    if (expected == Expected::DepartedElsewhere) throw_departure(call, call, opts);
    accept_prediction(call, fingerprint);
  }
  return matched;
}

CheckedGroup::Expected CheckedGroup::compare_with_prediction(const CollectiveCall& call,
                                                             Predictor::Fingerprint& fingerprint) const {
  const auto expected = predictor_.expect(call.sequence);
  if (!expected) return Expected::Nothing;
  fingerprint = call.fingerprint();
  if (fingerprint != *expected) return Expected::Departs;
  const uint64_t departure = liveness_->departure();
  return departure == call.sequence && departure > settled_departure_ ? Expected::DepartedElsewhere : Expected::Matches;
}

void CheckedGroup::accept_prediction(CollectiveCall& call, const Predictor::Fingerprint& fingerprint,
                                     std::shared_ptr<const CollectiveCall> kept) {
  call.predicted = true;
  predictor_.record(fingerprint);
  liveness_->issued_on_prediction(kept ? std::move(kept) : kept_call(call));
}

// Nobody may have issued `call` yet: every rank says what it called (Liveness::report_call). When all
// departed, the exchange that follows decides as it would have without a prediction.
void CheckedGroup::depart(const CollectiveCall& call, const CollectiveOptions& opts) {
  liveness_->report_call(call.sequence, true, call.describe());
  const std::vector<std::string> reports = wait_for_reports(call, opts);
  const bool every_rank_departed =
      std::all_of(reports.begin(), reports.end(), [](const std::string& r) { return r.rfind("departs|", 0) == 0; });
  if (every_rank_departed) {
    settled_departure_ = call.sequence;
    return;
  }
  mark_failed(call);
  throw CollectiveMismatch(options_.rank, calls_of(reports), true);
}

// This rank issued (or was about to issue) `issued`, collective `departure` on the prediction, where
// another rank's call departs: its collective will never complete.
void CheckedGroup::throw_departure(const CollectiveCall& issued, const CollectiveCall& waiting,
                                   const CollectiveOptions& opts) {
  liveness_->report_call(issued.sequence, false, issued.describe());
  std::vector<std::string> reports = wait_for_reports(issued, opts);
  mark_failed(waiting);
  throw CollectiveMismatch(options_.rank, calls_of(reports), true);
}

// A rank's report is "departs|<call>" or "issued|<call>": the calls, for CollectiveMismatch.
std::vector<std::string> CheckedGroup::calls_of(const std::vector<std::string>& reports) {
  std::vector<std::string> calls;
  for (const auto& r : reports) calls.push_back(r.substr(r.find('|') + 1));
  return calls;
}

std::vector<std::string> CheckedGroup::wait_for_reports(const CollectiveCall& call, const CollectiveOptions& opts) {
  ReportsWork reports(*liveness_, call.sequence);
  CollectiveCall unpredicted = call;  // its wait must not look for departures itself
  unpredicted.predicted = false;
  finish(reports, unpredicted, opts);
  return *reports.reports;
}

// While a collective issued on the prediction waits: has a rank departed at it, or before it?
void CheckedGroup::check_departure(const CollectiveCall& call, const CollectiveOptions& opts) {
  const uint64_t departure = liveness_->departure();
  if (departure == 0 || departure <= settled_departure_ || departure > call.sequence) return;
  CollectiveCall issued = call;
  issued.sequence = departure;
  throw_departure(issued, call, opts);
}

}  // namespace lockstep::dist
