// The checked channel: the one Group implementation for many ranks, whatever moves the bytes. It
// owns what G1 and G2 promise (docs/distributed.md): sequence numbers, the fingerprint exchange
// before any data moves (a disagreement is a CollectiveMismatch on every rank), or once the calls
// repeat the check against their prediction (predictor.h, no exchange; a rank that departs from it is
// found through the store), waits that watch
// the other ranks' heartbeats (a dead rank is named within ~2 s, a stalled one at the timeout with
// where every rank is), and the reports. Under it, transports (transport.h): the control transport
// carries fingerprints and CPU tensors; a device transport (NCCL) carries CUDA tensors. Internal
// to src/dist: make_process_group and make_in_memory_groups build it.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "in_order.h"
#include "liveness.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/group.h"
#include "predictor.h"
#include "transport.h"

namespace lockstep::dist {

struct CheckedGroupOptions {
  int rank = 0;
  int size = 1;
  std::string where;  // for describe(): "gloo, rank 1 of 2 via 127.0.0.1:29500"
  // What the group is, where ranks are numbered within it (a subgroup): errors then say "rank 0 of 2
  // (<name>)", so that a reader can tell which processes they mean. Empty: "rank 0 of 2".
  std::string name;
  // The members' ranks in the job (a subgroup's members as the user knows them), when they differ from
  // the group's numbering: errors then name both, "rank(s) 0 (global rank 3) died". Empty: the same.
  std::vector<int> global_ranks;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  bool checked = true;  // exchange fingerprints (off only to measure what the check costs)
  // Once the agreed calls repeat, check each call against the one they predict, locally, with no exchange
  // (predictor.h; docs/distributed.md "Predicted checks"). Off: every call exchanges its fingerprint.
  bool predict = true;
  // After a failure rank 0 keeps the store (which the others read their reports from) up this long.
  std::chrono::milliseconds store_grace{2000};
};

class CheckedGroup final : public Group {
 public:
  // `store`: where heartbeats and statuses are published (the rendezvous store, or an in-memory
  // one shared by thread ranks). `control` carries fingerprints and CPU tensors; `device`, when
  // given, carries the tensors of its device type (CUDA).
  CheckedGroup(const CheckedGroupOptions& options, c10::intrusive_ptr<c10d::Store> store,
               std::unique_ptr<Transport> control, std::unique_ptr<Transport> device = nullptr);
  ~CheckedGroup() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string describe() const override { return options_.where; }
  bool carries(const c10::Device& device) const override {
    return control_->carries(device) || (device_ && device_->carries(device));
  }

  void all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op, const CollectiveOptions& opts) override;
  std::unique_ptr<PendingCollective> all_reduce_async(std::vector<at::Tensor>& tensors, ReduceOp op,
                                                      const CollectiveOptions& opts) override;
  std::vector<at::Tensor> all_gather(const at::Tensor& input, const CollectiveOptions& opts) override;
  void broadcast(std::vector<at::Tensor>& tensors, int root, const CollectiveOptions& opts) override;
  void barrier(const CollectiveOptions& opts) override;
  // check_foreign_collective (collective.h): a sequence number, the agreement and the watch, no data.
  void check_foreign(const std::string& op, const std::vector<at::Tensor>& tensors, const CollectiveOptions& opts,
                     bool compare_site);
  // check_foreign off the caller's thread: returns at once. The check runs on the group's worker after
  // every collective submitted before it; then `then(error)` runs there (error null when every rank
  // agreed, else the CollectiveMismatch or CollectiveFailure), before any collective submitted after it:
  // `then` issues the checked collective, so that it pairs with the same one on every rank. `then` must
  // not throw, nor wait for another collective of this group.
  // Returns the check's turn, for wait_for_turn.
  uint64_t check_foreign_then(const std::string& op, const std::vector<at::Tensor>& tensors, const std::string& tag,
                              const std::string& file, int line, bool compare_site,
                              std::function<void(std::exception_ptr)> then);
  // check_foreign_then for a collective whose waiter watches it through finish_watched: its check may
  // pass on the prediction, with no exchange; `then` then gets the call (else null), to hand the waiter
  // (it holds the strings its call site points to).
  using WatchedThen = std::function<void(std::exception_ptr, std::shared_ptr<const CollectiveCall> predicted)>;
  uint64_t check_foreign_then_watched(const std::string& op, const std::vector<at::Tensor>& tensors,
                                      const std::string& tag, const std::string& file, int line, bool compare_site,
                                      WatchedThen then);
  // Waits for `work`, a collective issued after its check passed on the prediction (`call`), watching
  // the other ranks as the group's own collectives do: a rank that departed from the prediction there
  // is a CollectiveMismatch, a dead one PeerLost, a stalled one CollectiveTimeout. With `limit` (a caller's
  // own wait timeout), returns false once it passed with the collective still pending.
  bool finish_watched(TransportWork& work, const CollectiveCall& call,
                      std::optional<std::chrono::milliseconds> limit = std::nullopt) {
    return finish(work, call, CollectiveOptions(call.site), limit);
  }
  // Returns once `turn` ran, running posted turns on the calling thread meanwhile (InOrder::wait_for_turn).
  void wait_for_turn(uint64_t turn) { order_.wait_for_turn(turn); }
  void set_progress(const std::string& progress) override { liveness_->set_progress(progress); }

 private:
  class Pending;
  std::unique_ptr<Pending> start_all_reduce(std::vector<at::Tensor>& tensors, ReduceOp op,
                                            const CollectiveOptions& opts, bool on_worker);

  std::chrono::milliseconds timeout_of(const CollectiveOptions& opts) const;
  Transport& transport_for(const std::vector<at::Tensor>& tensors, const char* op, const CollectiveOptions& opts);
  struct PostedCheck;
  // check_foreign's work, in the call's turn: its sequence number, the agreement, the watch.
  void check_in_turn(CollectiveCall& call, const CollectiveOptions& opts);
  // A posted check's turn: it and the posted checks submitted right after it (up to kWindow, nothing
  // else in between) are agreed on in one exchange; those every rank had are issued, in order.
  void check_window(const std::shared_ptr<PostedCheck>& first);
  // The fingerprints of `calls` (at most kWindow) against every rank's: how many agree from the first
  // on, at most the fewest any rank offered; `differs` when the next one differs on some rank. Every
  // rank acts on the same verdict.
  size_t agree_on_window(std::vector<CollectiveCall>& calls, const CollectiveOptions& opts, bool& differs);
  size_t exchange_fingerprints(const std::vector<CollectiveCall>& calls, const CollectiveOptions& opts, bool& differs);
  uint64_t post_check(const std::string& op, const std::vector<at::Tensor>& tensors, const std::string& tag,
                      const std::string& file, int line, bool compare_site, bool watched, WatchedThen then);
  // Predicted checks (predictor.h): how many calls from the first on match the prediction (each marked
  // predicted); a departure from it is settled with every rank through the store.
  size_t agree_on_prediction(std::vector<CollectiveCall>& calls, const CollectiveOptions& opts);
  enum class Expected { Nothing, Matches, Departs, DepartedElsewhere };
  // In turn: what the prediction says of `call` (numbered); its fingerprint, when there is a prediction.
  Expected compare_with_prediction(const CollectiveCall& call, Predictor::Fingerprint& fingerprint) const;
  // `kept`: the call as the status keeps it (kept_call), when the caller has one that outlives it.
  void accept_prediction(CollectiveCall& call, const Predictor::Fingerprint& fingerprint,
                         std::shared_ptr<const CollectiveCall> kept = nullptr);
  bool issue_on_prediction(const std::shared_ptr<PostedCheck>& check);
  void depart(const CollectiveCall& call, const CollectiveOptions& opts);
  [[noreturn]] void throw_departure(const CollectiveCall& issued, const CollectiveCall& waiting,
                                    const CollectiveOptions& opts);
  void check_departure(const CollectiveCall& call, const CollectiveOptions& opts);
  std::vector<std::string> wait_for_reports(const CollectiveCall& call, const CollectiveOptions& opts);
  static std::vector<std::string> calls_of(const std::vector<std::string>& reports);
  // Every rank's description of `call`, exchanged after the fingerprints differed: CollectiveMismatch.
  [[noreturn]] void throw_mismatch(const CollectiveCall& call, const CollectiveOptions& opts);
  // G1: fingerprints exchanged on the control transport; CollectiveMismatch on every rank when
  // they differ, naming each rank's call.
  void agree(CollectiveCall& call, const CollectiveOptions& opts);
  std::vector<at::Tensor> gather_on_control(const at::Tensor& t, const CollectiveCall& call,
                                            const CollectiveOptions& opts);
  // G2: waits for `work` in slices, watching the other ranks in between.
  // With `limit`, false once it passed with the work still pending; else true when the work completed.
  bool finish(TransportWork& work, const CollectiveCall& call, const CollectiveOptions& opts,
              std::optional<std::chrono::milliseconds> limit = std::nullopt);
  [[noreturn]] void throw_timeout(const CollectiveCall& call, std::chrono::milliseconds timeout,
                                  const std::vector<int>& silent);
  [[noreturn]] void fail(const CollectiveCall& call, const std::exception& e);
  // The group is unusable after a failed collective: ranks stopped at different points.
  void mark_failed(const CollectiveCall& call);
  // "rank 1 of 2", with the group's name when it has one: how errors name this rank.
  std::string who() const;
  // "0, 2", or "0, 2 (global ranks 3, 5)" for a subgroup's members: how errors name other ranks.
  std::string ranks_text(const std::vector<int>& ranks) const;
  // Refuses a collective on a failed group at once, naming the collective that failed.
  void require_usable(const char* op, const CollectiveOptions& opts) const;

  CheckedGroupOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<Transport> control_;
  std::unique_ptr<Transport> device_;
  std::unique_ptr<Liveness> liveness_;
  uint64_t sequence_ = 0;  // under order_'s turn
  Predictor predictor_;    // under order_'s turn
  // The latest departure from the prediction at which every rank departed (nothing was issued).
  std::atomic<uint64_t> settled_departure_{0};
  // A collective failed: the group is unusable. Set where a wait fails, which may be outside order_'s turn.
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mutex_;
  std::string failed_call_;  // the first failed collective, described (under failure_mutex_)
  // Posted checks not yet agreed on, in order of submission (under checks_mutex_).
  static constexpr size_t kWindow = 8;
  std::mutex checks_mutex_;
  std::deque<std::shared_ptr<PostedCheck>> checks_;
  // Collectives are issued one at a time, in the order they were submitted, from whichever thread.
  // Last, so that it is destroyed first: its destructor runs what was posted, which uses the rest.
  InOrder order_;
};

}  // namespace lockstep::dist
