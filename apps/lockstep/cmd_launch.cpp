// `lockstep launch -n N [--nnodes M --node-rank i --master-addr A --master-port P] -- SUBCOMMAND ...`:
// starts this node's ranks of a distributed run with torchrun's environment, prefixes their output
// with [rank r/w], and when one fails, stops the others and exits with its status.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "lockstep/core/error.h"

namespace lockstep::cli {
namespace {

struct LaunchOptions {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double grace_s = 5;  // after a failure, how long the others get to stop before SIGKILL
  std::vector<std::string> command;
};

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of the rank's stdout + stderr
  int rank = 0;
  std::string pending;  // output after the last newline
  bool running = true;
  int status = 0;
};

std::string self_path() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  LOCKSTEP_THROW_IF_NOT(n > 0, Error, "launch: cannot find this program (/proc/self/exe): ", std::strerror(errno));
  return std::string(buf.data(), static_cast<size_t>(n));
}

Child start(const LaunchOptions& o, int local_rank, const std::string& program) {
  int fds[2];
  LOCKSTEP_THROW_IF_NOT(::pipe(fds) == 0, Error, "launch: pipe failed: ", std::strerror(errno));
  Child c;
  c.rank = o.node_rank * o.nproc + local_rank;
  c.pid = ::fork();
  LOCKSTEP_THROW_IF_NOT(c.pid >= 0, Error, "launch: fork failed: ", std::strerror(errno));
  if (c.pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    const int world = o.nnodes * o.nproc;
    ::setenv("RANK", std::to_string(c.rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
    ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(program.c_str(), argv.data());
    std::fprintf(stderr, "lockstep launch: cannot run %s: %s\n", program.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  c.fd = fds[0];
  return c;
}

// Prints every complete line read from the child, prefixed; at end of stream, the rest.
void drain(Child& c, int world, bool eof) {
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(c.fd, buf, sizeof buf);
    if (n <= 0) break;
    c.pending.append(buf, static_cast<size_t>(n));
    if (n < static_cast<ssize_t>(sizeof buf)) break;
  }
  size_t start = 0, end;
  while ((end = c.pending.find('\n', start)) != std::string::npos) {
    std::cout << "[rank " << c.rank << "/" << world << "] " << c.pending.substr(start, end - start + 1);
    start = end + 1;
  }
  c.pending.erase(0, start);
  if (eof && !c.pending.empty()) {
    std::cout << "[rank " << c.rank << "/" << world << "] " << c.pending << "\n";
    c.pending.clear();
  }
  std::cout.flush();
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "unknown status";
}

int run_launch(const LaunchOptions& o) {
  LOCKSTEP_CHECK_ARG(!o.command.empty(), "launch: give the subcommand to run after --, e.g. lockstep launch -n 2 -- "
                                         "train --steps 100");
  LOCKSTEP_CHECK_ARG(o.node_rank >= 0 && o.node_rank < o.nnodes, "launch: --node-rank ", o.node_rank,
                     " must lie in [0, --nnodes ", o.nnodes, ")");
  const int world = o.nnodes * o.nproc;
  const std::string program = self_path();
  std::vector<Child> children;
  for (int l = 0; l < o.nproc; ++l) children.push_back(start(o, l, program));

  int failed = -1;  // index of the first child that failed
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  int running = o.nproc;
  while (running > 0) {
    std::vector<pollfd> fds;
    for (auto& c : children) {
      if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 50);
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (auto& c : children) {
      if (c.fd >= 0) drain(c, world, false);
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.status = status;
      --running;
      if (c.fd >= 0) {
        drain(c, world, true);
        ::close(c.fd);
        c.fd = -1;
      }
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && failed < 0) {
        failed = static_cast<int>(&c - children.data());
        std::cout << "lockstep launch: rank " << c.rank << " failed (" << describe_status(status)
                  << "); stopping the other ranks\n";
        std::cout.flush();
        for (auto& other : children) {
          if (other.running) ::kill(other.pid, SIGTERM);
        }
        stop_deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000));
      }
    }
    if (failed >= 0 && std::chrono::steady_clock::now() > stop_deadline) {
      for (auto& other : children) {
        if (other.running) ::kill(other.pid, SIGKILL);
      }
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
  }
  if (failed < 0) return kExitOk;
  const Child& c = children[failed];
  std::cerr << "lockstep: error: rank " << c.rank << " of " << world << " failed with "
            << describe_status(c.status) << " (its output is above, prefixed [rank " << c.rank << "/" << world
            << "])\n";
  return WIFEXITED(c.status) ? WEXITSTATUS(c.status) : kExitError;
}

}  // namespace

void add_launch_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand(
      "launch",
      "Start this node's ranks of a distributed run: lockstep launch -n N [--nnodes M --node-rank i "
      "--master-addr A --master-port P] -- SUBCOMMAND ARGS. Each rank runs `lockstep SUBCOMMAND ARGS` with "
      "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (as torchrun sets "
      "them); output lines are prefixed [rank r/w]. When a rank fails, the others get SIGTERM (SIGKILL after "
      "a grace period) and launch exits with the failed rank's status.");
  cmd->add_option("-n,--nproc-per-node", opt->nproc, "Ranks to start on this node")
      ->required()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--nnodes", opt->nnodes, "Nodes in the run")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--node-rank", opt->node_rank, "This node's index in [0, nnodes)")->capture_default_str();
  cmd->add_option("--master-addr", opt->master_addr, "Address of node 0, where rank 0 hosts the store")
      ->capture_default_str();
  cmd->add_option("--master-port", opt->master_port, "Port of rank 0's store")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--grace", opt->grace_s, "Seconds the other ranks get to stop after one fails")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("command", opt->command, "The lockstep subcommand and its arguments, after --")->required();
  cmd->callback([&run, opt] { run = [opt] { return run_launch(*opt); }; });
}

}  // namespace lockstep::cli
