// Runs W ranks of a group as threads of this test: over Gloo on 127.0.0.1 (a real process group),
// or joined in memory (no ports). A rank's exception is kept, not rethrown, so tests can assert
// what each rank saw.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "lockstep/dist/process_group.h"

namespace lockstep::dist::test_util {

// A port the kernel just handed out and released: free unless another process grabs it first.
// Only for tests that need a port where nobody listens; ranks use port 0 on rank 0 instead.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Tests assert that a failure is raised by lockstep's checks rather than by the 20 s timeout, with
// this much room for a loaded machine; the real figures (well under a second) come from the
// benchmarks (lockstep bench collectives, tests/cli/kill_a_rank.sh prints its figure).
constexpr double kFarBelowTheTimeoutS = 10.0;

inline GroupOptions local_options(int rank, int size, int port) {
  GroupOptions o;
  o.rank = rank;
  o.size = size;
  o.master_port = port;
  o.timeout = std::chrono::seconds(20);  // a hang fails the test well inside ctest's limit
  o.connect_timeout = std::chrono::seconds(20);
  return o;
}

// What joins the rank threads: the transport under the checked channel. GlooAndNccl: rank r's
// CUDA tensors on cuda:r over NCCL (a machine with `size` GPUs).
enum class Join { Gloo, InMemory, GlooAndNccl };
inline const char* join_name(Join join) {
  return join == Join::Gloo ? "Gloo" : join == Join::InMemory ? "InMemory" : "GlooAndNccl";
}

inline std::vector<std::exception_ptr> run_in_memory_ranks(int size, const std::function<void(Group&, int)>& body) {
  std::vector<std::exception_ptr> errors(size);
  const std::vector<std::shared_ptr<Group>> groups = make_in_memory_groups(local_options(0, size, 0));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(*groups[r], r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs body(group, rank) on `size` ranks; returns each rank's exception (null when it returned).
// Over Gloo, rank 0's store takes any free port (no port is guessed); the others connect once it
// listens.
inline std::vector<std::exception_ptr> run_ranks(int size, const std::function<void(Group&, int)>& body,
                                                 Join join = Join::Gloo) {
  // LibTorch creates its default CPU generator and its CUDA hooks on first use, behind static-init
  // guards whose fast path ThreadSanitizer cannot see (LibTorch is not instrumented): created here,
  // before the rank threads start, they are visibly there for all of them.
  (void)at::detail::getDefaultCPUGenerator();
  (void)at::detail::getCUDAHooks();
  if (join == Join::InMemory) return run_in_memory_ranks(size, body);
  std::vector<std::exception_ptr> errors(size);
  std::promise<int> listening;
  std::shared_future<int> port = listening.get_future().share();
  // Groups outlive every body: rank 0 hosts the store the others may still talk to.
  std::vector<std::shared_ptr<Group>> groups(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        GroupOptions o = local_options(r, size, 0);
        if (join == Join::GlooAndNccl) o.cuda_device = r;
        if (r == 0) {
          o.on_listening = [&listening](int p) { listening.set_value(p); };
        } else {
          if (port.wait_for(o.connect_timeout) != std::future_status::ready) {
            throw std::runtime_error("rank 0's store did not start listening");
          }
          o.master_port = port.get();
        }
        groups[r] = make_process_group(o);
        body(*groups[r], r);
      } catch (...) {
        if (r == 0 && port.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
          listening.set_value(1);  // rank 0 never listened: let the others fail to connect, not hang
        }
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// After a mismatch that no rank issued, the group still works: a sum of ones over every rank (each calls it).
inline bool group_still_sums(Group& g) {
  std::vector<at::Tensor> own{torch::ones({2})};
  g.all_reduce(own, ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.after"));
  return torch::equal(own[0], torch::full({2}, static_cast<float>(g.size())));
}

template <typename E>
std::string message_of(const std::exception_ptr& error) {
  if (!error) return "(no error)";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return dynamic_cast<const E*>(&e) ? std::string(e.what()) : std::string("(another exception) ") + e.what();
  } catch (...) {
    return "(not a std::exception)";
  }
  return "";
}

}  // namespace lockstep::dist::test_util
