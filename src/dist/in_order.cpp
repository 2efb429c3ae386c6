#include "in_order.h"

namespace lockstep::dist {

InOrder::~InOrder() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  turn_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void InOrder::run(const std::function<void()>& task) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t mine = next_ticket_++;
  ++waiting_;
  turn_.wait(lock, [&] { return serving_ == mine; });
  --waiting_;
  lock.unlock();
  const PassTurn pass{*this};
  task();
}

std::optional<uint64_t> InOrder::run_if_idle(const std::function<bool()>& task) {
  uint64_t mine = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (serving_ != next_ticket_) return std::nullopt;
    mine = next_ticket_++;
  }
  const PassTurn pass{*this};
  return task() ? std::optional<uint64_t>(mine) : std::nullopt;
}

bool InOrder::advance_locked() {
  ++serving_;
  return waiting_ > 0 || (!posted_.empty() && posted_.front().first == serving_);
}

void InOrder::pass_turn() {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wake = advance_locked();
  }
  if (wake) turn_.notify_all();
}

uint64_t InOrder::post(std::function<void()> task) {
  uint64_t mine = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mine = next_ticket_++;
    posted_.emplace_back(mine, std::move(task));
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  }
  turn_.notify_all();
  return mine;
}

// The posted task at the front, whose turn it is: run with the lock released, then the turn passes on.
void InOrder::run_posted_front(std::unique_lock<std::mutex>& lock) {
  std::function<void()> task = std::move(posted_.front().second);
  posted_.pop_front();
  lock.unlock();
  task();
  lock.lock();
  if (advance_locked()) turn_.notify_all();
}

void InOrder::wait_for_turn(uint64_t turn) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (serving_ <= turn) {
    if (posted_.empty() || posted_.front().first != serving_) {
      ++waiting_;
      turn_.wait(lock);
      --waiting_;
      continue;
    }
    run_posted_front(lock);
  }
}

// A posted task waits for its number's turn like a caller of run(): callers and the worker take
// turns by number, so a synchronous call submitted after posted ones runs after them.
void InOrder::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    turn_.wait(lock, [&] {
      return (!posted_.empty() && posted_.front().first == serving_) || (stopping_ && posted_.empty());
    });
    if (posted_.empty()) return;
    run_posted_front(lock);
  }
}

}  // namespace lockstep::dist
