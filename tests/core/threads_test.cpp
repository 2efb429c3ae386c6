// choose_threads: the threads a process runs and the reason it says for them.
#include "lockstep/core/threads.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <cstdlib>
#include <string>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? (void)::setenv(name_, old_.c_str(), 1) : (void)::unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

int cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

TEST(ChooseThreads, OmpNumThreadsIsTakenWhenItFits) {
  ScopedEnv omp("OMP_NUM_THREADS", "1");
  const ThreadChoice c = choose_threads(0);
  EXPECT_EQ(c.threads, 1);
  EXPECT_EQ(c.reason, "OMP_NUM_THREADS");
}

// OMP_NUM_THREADS=1000000 became 4 threads per core without a word: the cap is said.
TEST(ChooseThreads, AnOmpNumThreadsAboveTheCapIsCappedAndSaysSo) {
  ScopedEnv omp("OMP_NUM_THREADS", "1000000");
  const ThreadChoice c = choose_threads(0);
  EXPECT_EQ(c.threads, kMaxThreadsPerCore * cores());
  EXPECT_NE(c.reason.find("OMP_NUM_THREADS=1000000 capped at 4 per core"), std::string::npos) << c.reason;
}

TEST(ChooseThreads, AFlagAboveTheCapIsRefusedNamingIt) {
  try {
    choose_threads(1000000, "--threads");
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--threads 1000000 is more than 4 threads per core"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep
