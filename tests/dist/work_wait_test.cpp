// Waiting for a collective in slices: a work that completes just as a slice runs out is a success,
// not the "Operation timed out!" that Work::wait throws then (a race CI once hit: a 5-rank run
// failed at its first collective although every rank had completed it).
#include "dist/work_wait.h"

#include <gtest/gtest.h>

#include <stdexcept>

#if LOCKSTEP_HAVE_GLOO
namespace lockstep::dist {
namespace {

// Completes, successfully or not, at the very moment its wait gives up.
class LateWork : public c10d::Work {
 public:
  explicit LateWork(std::exception_ptr failure = nullptr) : failure_(std::move(failure)) {}
  bool wait(std::chrono::milliseconds) override {
    finish(failure_);
    throw std::runtime_error("Operation timed out!");
  }

 private:
  std::exception_ptr failure_;
};

// Never completes.
class StuckWork : public c10d::Work {
 public:
  bool wait(std::chrono::milliseconds) override { throw std::runtime_error("Operation timed out!"); }
};

TEST(WaitSlice, AWorkThatCompletesAsTheSliceEndsIsDone) {
  LateWork work;
  EXPECT_EQ(wait_slice(work, std::chrono::milliseconds(1)), SliceResult::Done);
}

TEST(WaitSlice, AWorkStillRunningIsPending) {
  StuckWork work;
  EXPECT_EQ(wait_slice(work, std::chrono::milliseconds(1)), SliceResult::Pending);
}

TEST(WaitSlice, AFailedWorkRethrowsItsOwnError) {
  LateWork work(std::make_exception_ptr(std::runtime_error("Connection closed by peer [127.0.0.1]:4242")));
  try {
    wait_slice(work, std::chrono::milliseconds(1));
    FAIL() << "a failed work was taken for done";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "Connection closed by peer [127.0.0.1]:4242");
  }
}

}  // namespace
}  // namespace lockstep::dist
#endif
