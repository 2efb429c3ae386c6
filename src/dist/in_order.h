// Runs a group's operations one at a time, in the order they were submitted, whichever thread
// submitted them. A network backend pairs each rank's k-th operation with every other rank's k-th
// (Gloo numbers them as they are issued), so a group must issue from one ordered stream even when
// its callers are several threads (the training loop, autograd's, a background check). Internal to
// src/dist.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace lockstep::dist {

class InOrder {
 public:
  InOrder() = default;
  // Runs what was posted and not yet run, then joins the worker.
  ~InOrder();
  InOrder(const InOrder&) = delete;
  InOrder& operator=(const InOrder&) = delete;

  // Runs `task` on the calling thread once everything submitted before it has run; its exception
  // reaches the caller. Never call it from inside a task (it would wait for itself).
  void run(const std::function<void()>& task);
  // Queues `task` to run on the worker thread after everything submitted before it, and returns at
  // once with its turn's number: submissions are numbered 0, 1, 2... in order, so consecutive numbers
  // mean nothing was submitted in between. A posted task must not throw (it reports its own outcome);
  // one that does ends the process.
  uint64_t post(std::function<void()> task);

  // When nothing submitted is waiting or running, runs `task` at once on the calling thread, in a turn of
  // its own, and returns that turn's number if the task says it did its work (true); else returns none,
  // and the caller submits as usual. For work that is quick when it can be done at all (a check that
  // passes on the prediction), sparing the worker's wake-up. Like run(), never from inside a task.
  std::optional<uint64_t> run_if_idle(const std::function<bool()>& task);

  // Returns once the submission numbered `turn` has run. Meanwhile the calling thread runs, itself, each
  // posted task whose turn has come and that the worker has not taken: a caller that waits for its own
  // collective does the work instead of waking the worker and being woken back (two thread switches).
  // Like run(), never from inside a task.
  void wait_for_turn(uint64_t turn);

 private:
  void work();
  void run_posted_front(std::unique_lock<std::mutex>& lock);
  void pass_turn();
  // With mutex_ held: the next turn; whether anyone asleep on turn_ may now go on.
  bool advance_locked();
  struct PassTurn {  // the turn passes on whether the task returns or throws
    InOrder& self;
    ~PassTurn() { self.pass_turn(); }
  };

  std::mutex mutex_;
  // Signalled when a task is posted, and when serving_ moves while a caller waits or the worker's task is due:
  // a turn that nobody waits for wakes nobody (the predicted checks pass one per collective).
  std::condition_variable turn_;
  int waiting_ = 0;           // callers of run() and wait_for_turn() asleep on turn_
  uint64_t next_ticket_ = 0;  // the number the next submission takes
  uint64_t serving_ = 0;      // the number whose turn it is
  std::deque<std::pair<uint64_t, std::function<void()>>> posted_;
  bool stopping_ = false;
  std::thread worker_;  // started at the first post: a group that only runs never has one
};

}  // namespace lockstep::dist
