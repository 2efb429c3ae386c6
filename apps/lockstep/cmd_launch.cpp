// `lockstep launch -n N [--nnodes M --node-rank i --master-addr A --master-port P] -- SUBCOMMAND ...`:
// starts this node's ranks of a distributed run with torchrun's environment, prefixes their output
// with [rank r/w], and when one fails (or launch is told to stop), stops the others and exits.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "lockstep/core/error.h"

namespace lockstep::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct LaunchOptions {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = -1;  // -1: on one node, a free port rank 0's store gets from the kernel; else 29500
  double grace_s = 10;   // after a failure or a signal, how long the ranks get to stop before SIGKILL
  int max_restarts = 0;  // times every rank is started again after one is lost
  std::vector<std::string> command;
};

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end (non-blocking) of the rank's stdout + stderr; -1 at end of stream
  int rank = 0;
  std::string pending;  // output after the last newline
  bool running = true;
  int status = 0;
};

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_signals = 0;  // how many came: a second one is passed on too
extern "C" void on_launch_signal(int sig) {
  g_signal = sig;
  g_signals = g_signals + 1;
}

// A closed stdout (`launch ... | head`) stops the ranks as SIGTERM does, once; launch's later writes
// fail quietly instead of ending it before its ranks have saved.
extern "C" void on_launch_broken_pipe(int) {
  ::signal(SIGPIPE, SIG_IGN);
  if (g_signal == 0) {
    g_signal = SIGPIPE;
    g_signals = g_signals + 1;
  }
}

std::string self_path() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  LOCKSTEP_THROW_IF_NOT(n > 0, Error, "launch: cannot find this program (/proc/self/exe): ", std::strerror(errno));
  return std::string(buf.data(), static_cast<size_t>(n));
}

// Starts local rank `local_rank` with MASTER_PORT=port; `announce_fd` >= 0 is the pipe where the
// rank writes the port its store got (rank 0 with port 0). `restart`: how many times the ranks were
// started again (train resumes its --run-dir when it is above 0).
Child start(const LaunchOptions& o, int local_rank, int port, int announce_fd, const std::string& program,
            int restart) {
  int fds[2];
  LOCKSTEP_THROW_IF_NOT(::pipe2(fds, O_CLOEXEC) == 0, Error, "launch: pipe failed: ", std::strerror(errno));
  Child c;
  c.rank = o.node_rank * o.nproc + local_rank;
  const pid_t parent = ::getpid();
  c.pid = ::fork();
  LOCKSTEP_THROW_IF_NOT(c.pid >= 0, Error, "launch: fork failed: ", std::strerror(errno));
  if (c.pid == 0) {
    // If launch dies (even by SIGKILL), its ranks are told to stop rather than left running.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    const int world = o.nnodes * o.nproc;
    ::setenv("RANK", std::to_string(c.rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
    ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv(kRestartCountEnv, std::to_string(restart).c_str(), 1);
    if (announce_fd >= 0) {
      const int inherited = ::dup(announce_fd);  // without O_CLOEXEC: survives the exec
      ::setenv(kStorePortFdEnv, std::to_string(inherited).c_str(), 1);
    } else {
      ::unsetenv(kStorePortFdEnv);
    }
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(program.c_str(), argv.data());
    std::fprintf(stderr, "lockstep launch: cannot run %s: %s\n", program.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  c.fd = fds[0];
  return c;
}

// Prints every complete line the rank has written so far, prefixed, without ever blocking; at end
// of stream also the rest, and closes the stream.
void drain(Child& c, int world) {
  if (c.fd < 0) return;
  const std::string prefix = "[rank " + std::to_string(c.rank) + "/" + std::to_string(world) + "] ";
  char buf[65536];
  bool eof = false;
  for (int reads = 0; reads < 16; ++reads) {  // at most 1 MiB per turn, so no rank starves the rest
    const ssize_t n = ::read(c.fd, buf, sizeof buf);
    if (n > 0) {
      c.pending.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    break;
  }
  size_t start = 0, end;
  while ((end = c.pending.find('\n', start)) != std::string::npos) {
    std::cout << prefix << c.pending.substr(start, end - start + 1);
    start = end + 1;
  }
  c.pending.erase(0, start);
  if ((eof || c.pending.size() > (1u << 20)) && !c.pending.empty()) {  // a line without end is printed whole
    std::cout << prefix << c.pending << "\n";
    c.pending.clear();
  }
  std::cout.flush();
  if (eof) {
    ::close(c.fd);
    c.fd = -1;
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "unknown status";
}

// Reads what rank 0 announced on the port pipe: the port once a whole line is there, -1 while
// waiting, 0 when the pipe closed without one (the subcommand formed no process group).
int read_announced_port(int fd, std::string& text) {
  char buf[64];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return text.find('\n') != std::string::npos ? std::atoi(text.c_str()) : 0;
  }
  if (text.find('\n') == std::string::npos) return -1;
  return std::atoi(text.c_str());
}

class Launcher {
 public:
  Launcher(const LaunchOptions& o) : o_(o), world_(o.nnodes * o.nproc), program_(self_path()) {}

  int run() {
    install_signal_handlers();
    for (;;) {
      start_ranks();
      while (running() > 0 || awaiting_port_) step();
      if (!restart_after_lost_rank()) break;
    }
    restore_signal_handlers();
    return outcome();
  }

 private:
  // A lost rank (killed, or exit status 3) restarts every rank, up to --max-restarts times; other
  // failures (a configuration error, ranks that disagree, a diverged loss) would fail again.
  bool restart_after_lost_rank() {
    if (failed_ < 0 || signal_ != 0 || restarts_ >= o_.max_restarts) return false;
    const int status = children_[failed_].status;
    if (WIFEXITED(status) && WEXITSTATUS(status) != kExitRankLost) return false;
    ++restarts_;
    std::cout << "lockstep launch: rank " << children_[failed_].rank << " was lost (" << describe_status(status)
              << "); restart " << restarts_ << " of " << o_.max_restarts
              << ": every rank starts again from the run's last checkpoint\n"
              << std::flush;
    children_.clear();
    failed_ = -1;
    told_waiting_ = false;
    port_text_.clear();
    kill_deadline_ = Clock::time_point::max();
    return true;
  }

  void start_ranks() {
    const bool any_port = o_.master_port <= 0 && o_.nnodes == 1;
    if (any_port) {
      // Rank 0 first: its store takes a port from the kernel and says which; then the others.
      int fds[2];
      LOCKSTEP_THROW_IF_NOT(::pipe2(fds, O_CLOEXEC) == 0, Error, "launch: pipe failed: ", std::strerror(errno));
      children_.push_back(start(o_, 0, 0, fds[1], program_, restarts_));
      ::close(fds[1]);
      ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
      port_fd_ = fds[0];
      awaiting_port_ = o_.nproc > 1;
      waiting_since_ = Clock::now();
    } else {
      const int port = o_.master_port < 0 ? 29500 : o_.master_port;
      for (int l = 0; l < o_.nproc; ++l) children_.push_back(start(o_, l, port, -1, program_, restarts_));
    }
  }

  void step() {
    std::vector<pollfd> fds;
    for (const auto& c : children_) {
      if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
    }
    if (awaiting_port_ && port_fd_ >= 0) fds.push_back({port_fd_, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 50);  // a signal ends it early (EINTR): handled below
    for (auto& c : children_) drain(c, world_);
    reap();
    if (awaiting_port_) start_rest_when_announced();
    if (g_signal != 0 && signal_ == 0) stop_all_for_signal(g_signal);
    if (signal_ != 0 && g_signals > signals_passed_) pass_on_again(g_signal);
    if (Clock::now() > kill_deadline_) {
      for (auto& c : children_) {
        if (c.running) ::kill(c.pid, SIGKILL);
      }
      kill_deadline_ = Clock::time_point::max();
    }
  }

  // Starts ranks 1.. once rank 0 said its store's port; never after a failure or a signal.
  void start_rest_when_announced() {
    if (failed_ >= 0 || signal_ != 0) {
      awaiting_port_ = false;
      return;
    }
    int port = -1;
    if (port_fd_ >= 0) {
      port = read_announced_port(port_fd_, port_text_);
      if (port >= 0) {
        ::close(port_fd_);
        port_fd_ = -1;
      }
    } else if (!children_[0].running) {
      port = 0;  // rank 0 ended well without a group (e.g. `launch -- eval`): the others need no port
    }
    if (port == 0 && children_[0].running) return;  // its pipe closed as it exits: wait for its status
    if (port < 0) {
      if (!told_waiting_ && Clock::now() - waiting_since_ > std::chrono::seconds(30)) {
        std::cout << "lockstep launch: still waiting for rank 0's store to listen before starting the other ranks\n"
                  << std::flush;
        told_waiting_ = true;
      }
      return;
    }
    awaiting_port_ = false;
    for (int l = 1; l < o_.nproc; ++l) children_.push_back(start(o_, l, port, -1, program_, restarts_));
  }

  void reap() {
    for (auto& c : children_) {
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.status = status;
      // The rank's last words: read until the pipe ends (a grandchild holding it is not waited for).
      for (int i = 0; i < 64 && c.fd >= 0; ++i) drain(c, world_);
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && failed_ < 0 && signal_ == 0) {
        failed_ = static_cast<int>(&c - children_.data());
        // A rank interrupted on its own (a signal sent to it alone) saved its checkpoint, and the others
        // stop after the same step: no failure.
        const bool interrupted = WIFEXITED(status) && WEXITSTATUS(status) == kExitInterrupted;
        std::cout << "lockstep launch: rank " << c.rank
                  << (interrupted ? " stopped on an interrupt (exit status 130, the checkpoint saved)"
                                  : " failed (" + describe_status(status) + ")")
                  << "; stopping the other ranks\n"
                  << std::flush;
        stop_all(SIGTERM);
      }
    }
  }

  void stop_all_for_signal(int sig) {
    signal_ = sig;
    signals_passed_ = g_signals;
    std::cout << "lockstep launch: got " << strsignal(sig) << "; passing it to the ranks (SIGKILL after " << o_.grace_s
              << " s)\n"
              << std::flush;
    stop_all(sig == SIGHUP || sig == SIGPIPE ? SIGTERM : sig);
  }

  // A second signal to launch (a person insisting, or a scheduler's second SIGTERM) is passed on as
  // well: the ranks take a repeated interrupt as "stop at once".
  void pass_on_again(int sig) {
    signals_passed_ = g_signals;
    std::cout << "lockstep launch: got " << strsignal(sig) << " again; passing it on, the ranks stop at once\n"
              << std::flush;
    for (auto& c : children_) {
      if (c.running) ::kill(c.pid, sig == SIGHUP || sig == SIGPIPE ? SIGTERM : sig);
    }
  }

  // Sends `sig` to every running rank (and wakes stopped ones so they can act on it); SIGKILL follows
  // after the grace period.
  void stop_all(int sig) {
    for (auto& c : children_) {
      if (!c.running) continue;
      ::kill(c.pid, sig);
      ::kill(c.pid, SIGCONT);
    }
    kill_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.grace_s * 1000));
  }

  int running() const {
    int n = 0;
    for (const auto& c : children_) n += c.running ? 1 : 0;
    return n;
  }

  int outcome() const {
    if (signal_ != 0) {
      std::cerr << "lockstep: launch stopped by " << strsignal(signal_) << "\n";
      return 128 + signal_;
    }
    if (failed_ < 0) return kExitOk;
    const Child& c = children_[failed_];
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == kExitInterrupted) {
      // Every rank stops after the same step, whichever was signalled: the first to exit is named.
      std::cerr << "lockstep: the run was interrupted (rank " << c.rank << " of " << world_
                << " exited with 130 first); its checkpoint is saved (--resume continues it)\n";
      return kExitInterrupted;
    }
    std::cerr << "lockstep: error: rank " << c.rank << " of " << world_ << " failed with " << describe_status(c.status)
              << " (its output is above, prefixed [rank " << c.rank << "/" << world_ << "])\n";
    // A rank ended by a signal (killed, crashed) is a lost rank, as the exit table says: resume may succeed.
    return WIFEXITED(c.status) ? WEXITSTATUS(c.status) : kExitRankLost;
  }

  static void install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_launch_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: poll returns at once
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
    sa.sa_handler = on_launch_broken_pipe;
    ::sigaction(SIGPIPE, &sa, nullptr);
  }
  static void restore_signal_handlers() {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    ::signal(SIGPIPE, SIG_IGN);  // the closing line may meet the closed pipe too
  }

  const LaunchOptions& o_;
  const int world_;
  const std::string program_;
  std::vector<Child> children_;
  bool awaiting_port_ = false;  // ranks 1.. wait for the port of rank 0's store
  int port_fd_ = -1;            // rank 0's port announcement, while open
  std::string port_text_;
  Clock::time_point waiting_since_;
  bool told_waiting_ = false;
  int failed_ = -1;         // index of the first child that failed
  int signal_ = 0;          // the signal launch was stopped by
  int signals_passed_ = 0;  // how many of launch's signals were passed on to the ranks
  int restarts_ = 0;
  Clock::time_point kill_deadline_ = Clock::time_point::max();
};

int run_launch(const LaunchOptions& o) {
  LOCKSTEP_CHECK_USAGE(!o.command.empty(),
                       "launch: give the subcommand to run after --, e.g. lockstep launch -n 2 -- "
                       "train --steps 100");
  LOCKSTEP_CHECK_USAGE(o.node_rank >= 0 && o.node_rank < o.nnodes, "launch: --node-rank ", o.node_rank,
                       " must lie in [0, --nnodes ", o.nnodes, ")");
  LOCKSTEP_CHECK_USAGE(o.master_port != 0 || o.nnodes == 1,
                       "launch: --master-port 0 (any free port) works on one node ", "only; with --nnodes ", o.nnodes,
                       " every node must be given the same port");
  // A launch inside a rank of another would start ranks that join neither run.
  LOCKSTEP_CHECK_USAGE(std::getenv("LOCAL_RANK") == nullptr, "launch: this process is already rank ",
                       std::getenv("RANK") ? std::getenv("RANK") : "?",
                       " of a launched run (LOCAL_RANK=", std::getenv("LOCAL_RANK"),
                       " is set); run the subcommand directly, or launch from outside it");
  if (o.max_restarts > 0) {
    LOCKSTEP_CHECK_USAGE(o.nnodes == 1, "launch: --max-restarts restarts the ranks of one node; across ", o.nnodes,
                         " nodes use torchrun --max-restarts, which lockstep train follows too");
    const auto& c = o.command;
    const bool names_run = std::any_of(c.begin(), c.end(), [](const std::string& a) {
      return a == "--run-dir" || a == "--resume" || a.rfind("--run-dir=", 0) == 0 || a.rfind("--resume=", 0) == 0;
    });
    LOCKSTEP_CHECK_USAGE(c[0] == "train" && names_run, "launch: --max-restarts resumes a training run from its ",
                         "checkpoint, so the command must be `train --run-dir DIR ...` or `train --resume DIR`");
  }
  return Launcher(o).run();
}

}  // namespace

void add_launch_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand(
      "launch",
      "Start this node's ranks of a distributed run: lockstep launch -n N [--nnodes M --node-rank i "
      "--master-addr A --master-port P] -- SUBCOMMAND ARGS. Each rank runs `lockstep SUBCOMMAND ARGS` with "
      "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (as torchrun sets "
      "them); output lines are prefixed [rank r/w]. The ranks of a node share its cores (each takes cores / N "
      "intra-op threads unless --threads or OMP_NUM_THREADS says otherwise). When a rank fails, or launch gets "
      "SIGINT, SIGTERM or SIGHUP, the ranks are stopped (SIGKILL after --grace seconds) and launch exits with "
      "the failed rank's status (128 + the signal's number when stopped by one).");
  cmd->add_option("-n,--nproc-per-node", opt->nproc, "Ranks to start on this node")
      ->required()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--nnodes", opt->nnodes, "Nodes in the run")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--node-rank", opt->node_rank, "This node's index in [0, nnodes)")->capture_default_str();
  cmd->add_option("--master-addr", opt->master_addr, "Address of node 0, where rank 0 hosts the store")
      ->capture_default_str();
  cmd->add_option("--master-port", opt->master_port,
                  "Port of rank 0's store (default: on one node, a free port the kernel gives rank 0's store, so "
                  "runs side by side never collide; with --nnodes > 1, 29500)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--grace", opt->grace_s, "Seconds the ranks get to stop after one fails or launch is stopped")
      ->capture_default_str()
      ->check(kNonNegativeReal);
  cmd->add_option("--max-restarts", opt->max_restarts,
                  "When a rank is lost (killed, or exit status 3), stop the others and start every rank again, "
                  "resuming the run's --run-dir from its last checkpoint, up to this many times (one node; train "
                  "only)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("command", opt->command, "The lockstep subcommand and its arguments, after --")->required();
  cmd->callback([&run, opt] { run = [opt] { return run_launch(*opt); }; });
}

}  // namespace lockstep::cli
