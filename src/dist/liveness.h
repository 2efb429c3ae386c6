// G2 for a process group: every rank publishes a heartbeat and where it is (its progress and its
// current or last collective) in the rendezvous store; the others read them to name ranks that died
// and to say where everyone is when a collective fails or times out. Internal to src/dist.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/dist/collective.h"

namespace lockstep::dist {

// A copy of `call` that owns what its site points to (the tag and file), for keeping past its caller's strings.
std::shared_ptr<const CollectiveCall> kept_call(const CollectiveCall& call);

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;
  // A rank publishes every kBeat; one whose beat has not moved for kDeadAfter (on the reader's
  // clock, so nodes' clocks need not agree) is silent: dead if its process is gone, else stalled.
  static constexpr std::chrono::milliseconds kBeat{250};
  static constexpr std::chrono::milliseconds kDeadAfter{1500};
  // A read of the store unanswered after this long reads as "unreachable". Over a network cut
  // (packets dropped, nothing reset) TCPStore would wait for TCP to give up, many minutes; the
  // read goes on on its own thread and the rank that waits is never blocked by it.
  static constexpr std::chrono::milliseconds kStoreAnswer{1000};
  // A watch reads every rank's status only this close to its timeout (to name the silent ones); before
  // that, its own host's ranks and the group's count of status changes, so W waiting ranks cost the
  // store O(W) reads a beat, not O(W^2).
  static constexpr std::chrono::milliseconds kEveryoneBeforeTimeout{kDeadAfter + 2 * kBeat};

  // Publishes this process's host and pid and starts the heartbeat thread.
  Liveness(c10::intrusive_ptr<c10d::Store> store, int rank, int size);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  void set_progress(const std::string& progress);  // "step 57", shown before the collective
  void set_note(const std::string& note);          // before the first collective
  void enter(const CollectiveCall& call);          // "in #7 all_reduce ..."
  void leave(const CollectiveCall& call);          // "after #7 all_reduce ..."

  // Predicted checks (predictor.h, docs/distributed.md): this rank issued `call` on the prediction,
  // with no exchange (this rank's status is then "after" it). Kept for the last kKeptPredicted such calls,
  // and described only when read (a status the heartbeat publishes, a report): not once per collective.
  // `call` must own what its site points to (kept_call).
  void issued_on_prediction(std::shared_ptr<const CollectiveCall> call);
  // Publishes this rank's call at collective `sequence`, where some rank's call departs from the
  // prediction: `departs` for such a rank (which tells every rank's heartbeat), else a rank that had
  // issued the predicted call (reported as recorded by issued_on_prediction when it still is, else as
  // `description`). Every rank reports once one has departed.
  void report_call(uint64_t sequence, bool departs, const std::string& description);
  // The latest collective at which some rank departed, as the heartbeat last read it (0: none). A rank
  // that had issued that collective on the prediction is reported by its heartbeat at once.
  uint64_t departure() const;
  // The same, read from the store now (by the heartbeat, waited for up to kStoreAnswer): when a collective
  // issued on the prediction failed, the rank that departed may have reported and exited since the last beat.
  uint64_t read_departure();
  // Every rank's report at `sequence` ("departs|..." or "issued|..."), once every rank has reported.
  std::optional<std::vector<std::string>> reports(uint64_t sequence) const;
  static constexpr size_t kKeptPredicted = 256;

  // After a backend error: watches the others for up to `window` and returns the ranks that are
  // gone (process gone on this host, silent for kDeadAfter, or found dead by another rank; rank 0 when
  // the store is gone). Every rank's status is read only after kEveryoneFrom, when no rank has
  // published the dead by then, and then again from kDeadAfter later.
  std::vector<int> dead_ranks(std::chrono::milliseconds window) const;
  static constexpr std::chrono::milliseconds kEveryoneFrom{500};

  // For polling while a collective is pending: call check() every kBeat or so; it returns the
  // ranks silent for kDeadAfter whose process this host can see is gone, and those another rank found
  // dead (a stopped or remote silent rank is a stall, for the timeout to report). last_progress() is when a rank last
  // published a new status (progress, or a collective entered or left): a rank still working,
  // e.g. scanning a folder before its first collective, is not stalled. A check reads only this host's
  // ranks' statuses (whose death this host can see) and the group's count of status changes, unless
  // `everyone` (from kEveryoneBeforeTimeout before the timeout): a straggler that makes every collective
  // wait a beat then costs the store O(W) reads a collective, not O(W^2).
  class Watch {
   public:
    explicit Watch(const Liveness& liveness) : liveness_(liveness), last_progress_(Clock::now()) {}
    std::vector<int> check(bool everyone = false);
    Clock::time_point last_progress() const { return last_progress_; }
    // Other ranks whose beat this watch has not seen move for kDeadAfter (an unreadable beat is
    // not a move): stopped, or cut off from this rank. Exact when the checks of the last kDeadAfter
    // and a beat before it read everyone.
    std::vector<int> silent() const;

   private:
    const Liveness& liveness_;
    std::vector<int64_t> beats_;
    std::vector<Clock::time_point> changed_;
    int64_t changes_ = -1;  // the group's count of status changes, as last read (-1: not read)
    Clock::time_point last_progress_;
  };

  // Every rank's status, one line each; with `waiting_for`, the ranks that have not reached
  // collective `sequence` are appended to it.
  std::string where_everyone_is(uint64_t sequence = 0, std::vector<int>* waiting_for = nullptr) const;

 private:
  enum class Process { Running, Stopped, Gone, Unknown };
  struct Status {
    int64_t beat = -1;  // -1: unreadable
    int64_t sequence = 0;
    bool inside = false;
    std::string text = "no status";
  };
  // What this object shares with its heartbeat thread and its store reads, which hold it too: a
  // thread stuck in a store that no longer answers is left behind, never joined.
  struct Shared;

  static void heartbeat_loop(std::shared_ptr<Shared> s);
  // In the heartbeat: reads whether a rank departed from the prediction, and reports this rank's call
  // there when it had issued it.
  static void watch_departures(Shared& s, std::unique_lock<std::mutex>& lock);
  static std::optional<std::string> issued_call(const Shared& s, uint64_t sequence);
  static std::string status_text(const Shared& s);
  struct Reading {
    std::vector<Status> statuses;  // a rank not read keeps what an earlier read found
    std::vector<bool> fresh;       // the ranks this read read
    int64_t changes = -1;          // the group's count of status changes (-1: unreadable)
    std::vector<int> dead;         // the ranks some rank found dead and published, sorted
  };
  static void read_store(std::shared_ptr<Shared> s, bool everyone);
  // Ranks this rank found dead, for every other rank to read (written by the heartbeat, never the caller).
  void publish_dead(const std::vector<int>& ranks) const;
  static void write_dead(Shared& s, std::unique_lock<std::mutex>& lock);
  static Status parse_status(const std::vector<uint8_t>& bytes);  // one rank's published status
  // Every rank's status, or with !everyone this host's ranks' only: read on a helper thread,
  // unreachable when it does not answer in time.
  Reading read_statuses(bool everyone = true) const;
  Process process_of(int r) const;  // from the process records that reads have brought in

  int rank_;
  int size_;
  std::shared_ptr<Shared> shared_;
  std::thread heartbeat_;
};

}  // namespace lockstep::dist
