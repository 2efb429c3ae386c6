// G2 with real processes: this test binary starts copies of itself as ranks (gloo's multi-process
// test style). One rank dies or stalls; the others must name it, in time, with where everyone was.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "dist/liveness.h"
#include "io/test_temp_dir.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/process_group.h"
#include "rank_threads.h"

extern char** environ;

namespace lockstep::dist {
namespace {

int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // one clock for every process of the machine
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The rank side, run only as a child (LOCKSTEP_LIVENESS_DIR set): collectives until something fails;
// after 3 of them rank 1 dies ("die"), stops issuing collectives while staying alive ("stall"), is
// frozen ("stop"), sends another shape ("shape"), or skips a collective the others issue ("skip").
TEST(LivenessChild, Rank) {
  const std::string dir = env_or("LOCKSTEP_LIVENESS_DIR", "");
  if (dir.empty()) GTEST_SKIP() << "runs only as a child of the Liveness tests";
  GroupOptions o;
  o.rank = std::stoi(env_or("LOCKSTEP_LIVENESS_RANK", "0"));
  o.size = std::stoi(env_or("LOCKSTEP_LIVENESS_SIZE", "3"));
  // Rank 0's store takes any free port and writes it to `port`; the others read it from there.
  const std::string port_file = dir + "/port";
  if (o.rank == 0) {
    o.master_port = 0;
    o.on_listening = [&](int port) {
      write_text(port_file + ".tmp", std::to_string(port));
      std::filesystem::rename(port_file + ".tmp", port_file);
    };
  } else {
    for (int i = 0; i < 400 && !std::filesystem::exists(port_file); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    o.master_port = std::stoi(read_text(port_file));
  }
  o.timeout = std::chrono::milliseconds(std::stoi(env_or("LOCKSTEP_LIVENESS_TIMEOUT_MS", "20000")));
  const std::string role = env_or("LOCKSTEP_LIVENESS_ROLE", "");
  const std::string me = dir + "/rank" + std::to_string(o.rank);
  std::shared_ptr<Group> group;  // outlives the catch: rank 0 keeps its store up a while when destroyed
  try {
    group = make_process_group(o);
    for (int i = 0; i < 100000; ++i) {
      group->set_progress("step " + std::to_string(i));
      if (o.rank == 1 && i == 3 && role == "die") {
        // Work a little (a heartbeat publishes "step 3"), then die as a crash would.
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        write_text(dir + "/event", std::to_string(monotonic_ns()));
        ::raise(SIGKILL);
      }
      if (o.rank == 1 && i == 3 && role == "stop") {  // frozen whole, as by SIGSTOP from a user
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        write_text(dir + "/event", std::to_string(monotonic_ns()));
        ::raise(SIGSTOP);
      }
      if (o.rank == 1 && i == 3 && role == "stall") {
        write_text(dir + "/event", std::to_string(monotonic_ns()));
        std::this_thread::sleep_for(std::chrono::seconds(60));
      }
      // G1 across processes: at the fourth collective rank 1 sends another shape, or the other
      // ranks issue a collective rank 1 skips (as when only some ranks evaluate).
      if (i == 3 && (role == "shape" || role == "skip") && o.rank == 1) {
        write_text(dir + "/event", std::to_string(monotonic_ns()));
      }
      if (i == 3 && role == "shape" && o.rank == 1) {
        std::vector<at::Tensor> t{torch::ones({8})};
        group->all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.other_shape"));
      }
      if (i == 3 && role == "skip" && o.rank != 1) {
        std::vector<at::Tensor> t{torch::ones({16})};
        group->broadcast(t, 0, LOCKSTEP_CALL_SITE("test.some_ranks_only"));
      }
      std::vector<at::Tensor> t{torch::ones({16})};
      group->all_reduce(t, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.loop"));
    }
    write_text(me + ".result", "finished without an error");
  } catch (const std::exception& e) {
    // The class a caller would catch, then the message.
    const char* type = dynamic_cast<const PeerLost*>(&e)             ? "PeerLost"
                       : dynamic_cast<const CollectiveTimeout*>(&e)  ? "CollectiveTimeout"
                       : dynamic_cast<const CollectiveMismatch*>(&e) ? "CollectiveMismatch"
                                                                     : "another exception";
    write_text(me + ".result", std::to_string(monotonic_ns()) + "\n" + type + "\n" + e.what());
  }
}

struct Outcome {
  std::vector<std::string> types;     // per rank, the exception's class
  std::vector<std::string> messages;  // per rank, without the time and class lines
  std::vector<double> seconds_after_event;
};

// Starts `size` ranks of this binary in `role`, waits (hard limit 40 s), then kills what is left.
Outcome run_children(const std::string& role, int size, int timeout_ms) {
  ::lockstep::test_util::TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    env_strings.push_back("LOCKSTEP_LIVENESS_DIR=" + dir.path());
    env_strings.push_back("LOCKSTEP_LIVENESS_RANK=" + std::to_string(r));
    env_strings.push_back("LOCKSTEP_LIVENESS_SIZE=" + std::to_string(size));
    env_strings.push_back("LOCKSTEP_LIVENESS_ROLE=" + role);
    env_strings.push_back("LOCKSTEP_LIVENESS_TIMEOUT_MS=" + std::to_string(timeout_ms));
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--gtest_filter=LivenessChild.Rank";
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t pid = 0;
    EXPECT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  std::vector<bool> done(size, false);
  int left = size;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < size; ++r) {
      if (done[r]) continue;
      // The stalled rank sleeps on: once the others have reported, stop it.
      const bool others_reported = (role == "stall" || role == "stop") && r == 1 && [&] {
        for (int k = 0; k < size; ++k) {
          if (k != 1 && !done[k]) return false;
        }
        return true;
      }();
      if (others_reported) ::kill(pids[r], SIGKILL);
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < size; ++r) {
    if (!done[r]) {
      ::kill(pids[r], SIGKILL);
      ::waitpid(pids[r], nullptr, 0);
      ADD_FAILURE() << "rank " << r << " was still running after 40 s";
    }
  }
  Outcome out;
  const std::string event = read_text(dir.path() + "/event");
  for (int r = 0; r < size; ++r) {
    const std::string text = read_text(dir.path() + "/rank" + std::to_string(r) + ".result");
    const size_t newline = text.find('\n');
    const size_t second = newline == std::string::npos ? std::string::npos : text.find('\n', newline + 1);
    out.types.push_back(second == std::string::npos ? "" : text.substr(newline + 1, second - newline - 1));
    out.messages.push_back(second == std::string::npos ? text : text.substr(second + 1));
    out.seconds_after_event.push_back(newline == std::string::npos || event.empty()
                                          ? -1
                                          : (std::stoll(text.substr(0, newline)) - std::stoll(event)) * 1e-9);
  }
  return out;
}

TEST(Liveness, ADeadRankIsNamedByEveryOtherRankLongBeforeTheTimeout) {
  const Outcome out = run_children("die", 3, 20000);
  for (int r : {0, 2}) {
    EXPECT_EQ(out.types[r], "PeerLost") << "rank " << r << ": " << out.messages[r];
    EXPECT_NE(out.messages[r].find("rank(s) 1 died"), std::string::npos) << "rank " << r << ": " << out.messages[r];
    EXPECT_NE(out.messages[r].find("rank 1 [process gone]: step 3"), std::string::npos)
        << "rank " << r << ": " << out.messages[r];
    EXPECT_GT(out.seconds_after_event[r], 0) << "rank " << r;
    // G2 promises 2 s (measured ~1.6 s); a loaded machine gets room, still far below the 20 s timeout.
    EXPECT_LT(out.seconds_after_event[r], test_util::kFarBelowTheTimeoutS) << "rank " << r << ": " << out.messages[r];
  }
}

TEST(Liveness, AStalledRankIsNamedAtTheTimeoutWithWhereEveryRankIs) {
  const Outcome out = run_children("stall", 3, 2000);
  for (int r : {0, 2}) {
    const std::string& m = out.messages[r];
    EXPECT_EQ(out.types[r], "CollectiveTimeout") << "rank " << r << ": " << m;
    EXPECT_NE(m.find("timed out after 2000 ms waiting for rank(s) 1;"), std::string::npos) << "rank " << r << ": " << m;
    // Rank 1 is alive but stopped after its third collective; the others wait in the fourth.
    EXPECT_NE(m.find("rank 1: step 3, after #3 all_reduce(sum)"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("rank " + std::to_string(r) + ": step 3, in #4 all_reduce(sum)"), std::string::npos)
        << "rank " << r << ": " << m;
    EXPECT_GT(out.seconds_after_event[r], 1.9) << "rank " << r;
    EXPECT_LT(out.seconds_after_event[r], 2.0 + test_util::kFarBelowTheTimeoutS) << "rank " << r;
  }
}

TEST(Liveness, AStoppedRankIsAStallNotADeathAndIsNamedAtTheTimeout) {
  // A death would be named ~1.5 s after rank 1 falls silent; the stall waits out the 4 s timeout.
  const Outcome out = run_children("stop", 3, 4000);
  for (int r : {0, 2}) {
    const std::string& m = out.messages[r];
    EXPECT_EQ(out.types[r], "CollectiveTimeout") << "rank " << r << ": " << m;
    EXPECT_NE(m.find("timed out after 4000 ms waiting for rank(s) 1;"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_NE(m.find("rank 1 [process stopped]: step 3, after #3"), std::string::npos) << "rank " << r << ": " << m;
    // Read from every rank's status in the last 2 s before the timeout.
    EXPECT_NE(m.find("no heartbeat from rank(s) 1 for over 1500 ms"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_EQ(m.find("died"), std::string::npos) << "rank " << r << ": " << m;
    EXPECT_GT(out.seconds_after_event[r], 2.5) << "rank " << r;
  }
}

// Failure mode c with real processes: a mismatched collective is CollectiveMismatch on every rank
// within a second of the mismatching call, naming the calls of both sides (the thread-rank tests
// cover every kind of mismatch).
void expect_mismatch_named_everywhere(const std::string& role, const std::vector<std::string>& parts) {
  const Outcome out = run_children(role, 3, 20000);
  for (int r = 0; r < 3; ++r) {
    const std::string& m = out.messages[r];
    EXPECT_EQ(out.types[r], "CollectiveMismatch") << "rank " << r << ": " << m;
    EXPECT_NE(m.find("seen by rank " + std::to_string(r)), std::string::npos) << "rank " << r << ": " << m;
    for (const auto& part : parts) {
      EXPECT_NE(m.find(part), std::string::npos) << "rank " << r << " lacks '" << part << "': " << m;
    }
    EXPECT_GE(out.seconds_after_event[r], 0) << "rank " << r;
    EXPECT_LT(out.seconds_after_event[r], test_util::kFarBelowTheTimeoutS) << "rank " << r << ": " << m;
  }
}

TEST(Liveness, AMismatchedShapeBetweenProcessesIsNamedOnEveryRankBeforeTheTimeout) {
  expect_mismatch_named_everywhere("shape", {"test.other_shape", "test.loop", "float32 (8)", "float32 (16)"});
}

TEST(Liveness, ACollectiveOneProcessSkipsIsNamedOnEveryRankBeforeTheTimeout) {
  expect_mismatch_named_everywhere("skip",
                                   {"#4 broadcast(root 0)", "test.some_ranks_only", "#4 all_reduce(sum)", "test.loop"});
}

// A store that counts the rank statuses read from it.
class CountingStore : public c10d::HashStore {
 public:
  std::atomic<int> statuses_read{0};
  std::vector<uint8_t> get(const std::string& key) override {
    count({key});
    return HashStore::get(key);
  }
#if TORCH_VERSION_MAJOR >= 2
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    count(keys);
    return HashStore::multiGet(keys);
  }
#endif

 private:
  void count(const std::vector<std::string>& keys) {
    for (const auto& key : keys) statuses_read += key.rfind("lockstep/status/", 0) == 0 ? 1 : 0;
  }
};

void publish_status(c10d::Store& store, int rank, int beat) {
  const std::string text = std::to_string(beat) + "|3|1|step 3, in #3 all_reduce(sum)";
  store.set("lockstep/status/" + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
}

// The store's load while ranks wait grows with W, not W^2: a waiting rank's watch reads the statuses of its
// own host's ranks (the ones whose death it can see) and the count of status changes; every status only near
// its timeout, to name the silent ranks.
TEST(Liveness, AWaitingRanksWatchReadsItsHostsRanksAndTheCountOfChangesNotEveryStatus) {
  constexpr int kSize = 64;
  auto store = c10::make_intrusive<CountingStore>();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const pid_t gone = ::fork();  // a process of this host that exits at once: a rank that died
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  for (int r = 1; r < kSize; ++r) {  // ranks 1-3 on this host (rank 3's process gone), the rest elsewhere
    const std::string record = r <= 3 ? std::string(host) + "|" + std::to_string(r == 3 ? gone : ::getpid())
                                      : "another-host|" + std::to_string(r);
    store->set("lockstep/proc/" + std::to_string(r), std::vector<uint8_t>(record.begin(), record.end()));
    publish_status(*store, r, 1);
  }
  Liveness liveness(store, 0, kSize);
  std::this_thread::sleep_for(Liveness::kBeat + std::chrono::milliseconds(100));  // its first status is out

  Liveness::Watch watch(liveness);
  const auto started = watch.last_progress();
  store->statuses_read = 0;
  EXPECT_TRUE(watch.check().empty());
  EXPECT_EQ(store->statuses_read, 3) << "a check reads this host's other ranks only";
  store->statuses_read = 0;
  EXPECT_TRUE(watch.check().empty());
  EXPECT_EQ(store->statuses_read, 3);
  EXPECT_EQ(watch.last_progress(), started) << "no rank published a new status";

  store->add("lockstep/status_changes", 1);  // some rank published a new status
  watch.check();
  EXPECT_GT(watch.last_progress(), started);

  // Ranks 1, 2 and 40 beat on; rank 3 (process gone) and the other remote ranks fall silent.
  const auto silent_from = Liveness::Clock::now();
  const auto beat_on = [&] {
    const auto from = Liveness::Clock::now();
    while (Liveness::Clock::now() - from < Liveness::kDeadAfter + Liveness::kBeat) {
      const auto ms = (Liveness::Clock::now() - silent_from) / std::chrono::milliseconds(1);
      for (int r : {1, 2, 40}) publish_status(*store, r, static_cast<int>(ms));
      std::this_thread::sleep_for(Liveness::kBeat / 2);
    }
  };
  beat_on();
  store->statuses_read = 0;
  EXPECT_EQ(watch.check(), std::vector<int>{3}) << "a silent rank of this host whose process is gone is dead";
  EXPECT_EQ(store->statuses_read, 3);
  // Near the timeout every status is read: the first such read is the remote ranks' baseline, and those that
  // have not moved kDeadAfter after it are silent; rank 40, which beats, is not.
  store->statuses_read = 0;
  EXPECT_EQ(watch.check(true), std::vector<int>{3}) << "a remote silent rank is not known to be dead";
  EXPECT_EQ(store->statuses_read, kSize);
  beat_on();
  EXPECT_EQ(watch.check(true), std::vector<int>{3});
  std::vector<int> expected{3};
  for (int r = 4; r < kSize; ++r) {
    if (r != 40) expected.push_back(r);
  }
  EXPECT_EQ(watch.silent(), expected);
}

std::string text_at(c10d::Store& store, const std::string& key) {
  const auto bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

// After a backend error: a rank of this host whose process is gone is found without reading everyone's
// status, and published for the ranks of other hosts, which read it at their next check.
TEST(Liveness, ARankFoundDeadIsPublishedAndReadByTheOthersWithoutReadingEveryStatus) {
  constexpr int kSize = 64;
  auto store = c10::make_intrusive<CountingStore>();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  for (int r = 1; r < kSize; ++r) {  // as above: ranks 1-3 on this host, rank 3's process gone
    const std::string record = r <= 3 ? std::string(host) + "|" + std::to_string(r == 3 ? gone : ::getpid())
                                      : "another-host|" + std::to_string(r);
    store->set("lockstep/proc/" + std::to_string(r), std::vector<uint8_t>(record.begin(), record.end()));
    publish_status(*store, r, 1);
  }
  Liveness liveness(store, 0, kSize);
  store->statuses_read = 0;
  EXPECT_EQ(liveness.dead_ranks(std::chrono::milliseconds(2500)), std::vector<int>{3});
  EXPECT_EQ(store->statuses_read, 3) << "found among this host's ranks, before reading everyone";
  for (int i = 0; i < 100 && !store->check({"lockstep/dead/1"}); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(store->check({"lockstep/dead/1"})) << "the heartbeat publishes what this rank found";
  EXPECT_EQ(text_at(*store, "lockstep/dead/1"), "3");

  // Another host's rank found rank 50 dead; a finding numbered but not written yet is read later.
  store->add("lockstep/dead_count", 1);
  store->set("lockstep/dead/2", std::vector<uint8_t>{'5', '0'});
  store->add("lockstep/dead_count", 1);
  Liveness::Watch watch(liveness);
  EXPECT_EQ(watch.check(), (std::vector<int>{3, 50}));
  store->set("lockstep/dead/3", std::vector<uint8_t>{'7'});
  EXPECT_EQ(watch.check(), (std::vector<int>{3, 7, 50}));
}

// With no rank of this host to see and none published, the silent ranks are those whose beat did not move
// for kDeadAfter after every status was read: two reads of everyone, not one every half beat.
TEST(Liveness, SilentRanksOfOtherHostsAreFoundWithTwoReadsOfEveryStatus) {
  constexpr int kSize = 64;
  auto store = c10::make_intrusive<CountingStore>();
  for (int r = 1; r < kSize; ++r) {
    const std::string record = "another-host|" + std::to_string(r);
    store->set("lockstep/proc/" + std::to_string(r), std::vector<uint8_t>(record.begin(), record.end()));
    publish_status(*store, r, 1);
  }
  Liveness liveness(store, 0, kSize);
  std::atomic<bool> done{false};
  std::thread beating([&] {  // every rank but 7 and 9 beats on
    for (int beat = 2; !done; ++beat) {
      for (int r = 1; r < kSize; ++r) {
        if (r != 7 && r != 9) publish_status(*store, r, beat);
      }
      std::this_thread::sleep_for(Liveness::kBeat / 2);
    }
  });
  store->statuses_read = 0;
  const auto start = Liveness::Clock::now();
  const std::vector<int> dead = liveness.dead_ranks(std::chrono::milliseconds(3000));
  const double seconds = std::chrono::duration<double>(Liveness::Clock::now() - start).count();
  done = true;
  beating.join();
  EXPECT_EQ(dead, (std::vector<int>{7, 9}));
  EXPECT_EQ(store->statuses_read, 2 * kSize);
  EXPECT_GE(seconds, 2.0);  // kEveryoneFrom, then kDeadAfter
}

}  // namespace
}  // namespace lockstep::dist
