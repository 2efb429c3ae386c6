// A transport over one of torch's c10d backends (Gloo, NCCL): the operations the checked channel
// needs, mapped onto the backend's collectives. Internal to src/dist.
#pragma once

#include "lockstep/config_build.h"

#include <torch/version.h>
// c10d's headers come with LibTorch 2's wheel, and with a 1.13 whose Gloo headers were found.
#define LOCKSTEP_HAVE_C10D (LOCKSTEP_HAVE_GLOO || TORCH_VERSION_MAJOR >= 2)
#if LOCKSTEP_HAVE_C10D
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <functional>

#include "transport.h"

namespace lockstep::dist {

// LibTorch 2 splits a process group's backends (Gloo, NCCL) out of c10d::ProcessGroup; 1.13's Gloo
// group is a ProcessGroup itself. Both have the same collective calls.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// A host-side work (Gloo) waited for in slices by Work::wait.
std::unique_ptr<TransportWork> blocking_work(c10::intrusive_ptr<c10d::Work> work);

class C10dTransport : public Transport {
 public:
  // `backstop`: the backend's own timer, far above lockstep's (which counts from the last
  // progress another rank published); `abort`: what abandon() does (none for Gloo).
  C10dTransport(c10::intrusive_ptr<C10dBackend> backend, const char* name, c10::Device device,
                std::chrono::milliseconds backstop, std::function<void()> abort = {});
  ~C10dTransport() override;

  const char* name() const override { return name_; }
  bool carries(const c10::Device& device) const override {
    return device.type() == device_.type() && (!device_.has_index() || device.index() == device_.index());
  }
  std::unique_ptr<TransportWork> all_reduce(at::Tensor& buffer, ReduceOp op) override;
  std::unique_ptr<TransportWork> all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) override;
  std::unique_ptr<TransportWork> broadcast(at::Tensor& buffer, int root) override;
  std::unique_ptr<TransportWork> gather(std::vector<at::Tensor>& outputs, const at::Tensor& input, int root) override;
  void abandon() override;

 private:
  std::unique_ptr<TransportWork> wrap(c10::intrusive_ptr<c10d::Work> work) const;

  c10::intrusive_ptr<C10dBackend> backend_;
  const char* name_;
  c10::Device device_;
  std::chrono::milliseconds backstop_;
  std::function<void()> abort_;
  bool abandoned_ = false;
};

}  // namespace lockstep::dist
#endif
