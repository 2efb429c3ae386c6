#include "lockstep/core/threads.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// A positive integer from the environment, or 0 when `name` is unset or empty.
long long positive_env(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return 0;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  LOCKSTEP_CHECK_ARG(errno == 0 && *end == '\0' && value >= 1 && value <= 1'000'000, "environment variable ", name,
                     "='", std::string(text).substr(0, 40), "' is not a positive integer");
  return value;
}

}  // namespace

int local_world_size() {
  const long long n = positive_env("LOCAL_WORLD_SIZE");
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadChoice choose_threads(long long requested, const std::string& flag) {
  const int cores = usable_cores();
  const long long most = static_cast<long long>(kMaxThreadsPerCore) * cores;
  LOCKSTEP_CHECK_ARG(requested >= 0, flag, " ", requested, " must be >= 0 (0 chooses from the cores)");
  LOCKSTEP_CHECK_ARG(requested <= most, flag, " ", requested, " is more than ", kMaxThreadsPerCore,
                     " threads per core on this machine's ", cores, (cores == 1 ? " core" : " cores"), " (at most ",
                     most, ")");
  if (requested > 0) return {static_cast<int>(requested), flag};
  if (const long long omp = positive_env("OMP_NUM_THREADS"); omp > 0) {
    if (omp <= most) return {static_cast<int>(omp), "OMP_NUM_THREADS"};
    return {static_cast<int>(most),
            detail::concat("OMP_NUM_THREADS=", omp, " capped at ", kMaxThreadsPerCore, " per core on this machine's ",
                           cores, cores == 1 ? " core" : " cores")};
  }
  const int ranks = local_world_size();
  const int threads = std::max(1, cores / ranks);
  std::string reason = detail::concat(cores, cores == 1 ? " core" : " cores");
  if (ranks > 1) reason += detail::concat(" shared by ", ranks, " ranks on this node");
  return {threads, reason};
}

}  // namespace lockstep
