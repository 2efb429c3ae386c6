// What moves the bytes under the checked channel (checked_group.h): Gloo between processes (CPU
// tensors), NCCL between processes (CUDA tensors) and memory between threads. A transport knows
// nothing of fingerprints, sequence numbers, call sites or liveness; the checked channel calls it
// only once every rank agreed on the call, so a transport's collective always pairs with the
// same collective on every other rank. Internal to src/dist.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/group.h"

namespace lockstep::dist {

// One operation in flight.
class TransportWork {
 public:
  virtual ~TransportWork() = default;
  // Waits up to `slice`. True once the operation completed (its outputs are in place and usable on
  // this thread's current stream), false while it is still pending; throws the transport's own
  // error when it failed (a peer closed its connection, a communicator was aborted).
  virtual bool wait_for(std::chrono::milliseconds slice) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;  // "gloo", "nccl", "in-memory"
  // Whether this transport moves tensors on `device` (cpu; NCCL: its own cuda:N only).
  virtual bool carries(const c10::Device& device) const = 0;

  // Each call takes contiguous tensors; all ranks pass the same shapes and dtypes (the checked
  // channel made sure). In place: `buffer` ends as the reduction over all ranks.
  virtual std::unique_ptr<TransportWork> all_reduce(at::Tensor& buffer, ReduceOp op) = 0;
  // outputs: one tensor per rank, each of input's shape, filled in rank order.
  virtual std::unique_ptr<TransportWork> all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) = 0;
  // In place: every rank's `buffer` receives `root`'s.
  virtual std::unique_ptr<TransportWork> broadcast(at::Tensor& buffer, int root) = 0;
  // `root`'s outputs (one per rank, each of input's shape) receive every rank's input, in rank order;
  // the other ranks pass no outputs. One round: each rank sends to the root directly.
  virtual std::unique_ptr<TransportWork> gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                                int root) = 0;

  // After a failure, pending operations will never complete: release whatever waits on them
  // (NCCL aborts its communicator so that no GPU stream stays blocked). The transport is unusable
  // afterwards.
  virtual void abandon() {}
};

}  // namespace lockstep::dist
