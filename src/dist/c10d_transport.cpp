#include "c10d_transport.h"

#if LOCKSTEP_HAVE_C10D
#include <thread>
#include <utility>

#include "work_wait.h"

namespace lockstep::dist {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// Host-side waits (Gloo): Work::wait blocks for at most the slice.
class BlockingWork final : public TransportWork {
 public:
  explicit BlockingWork(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  bool wait_for(std::chrono::milliseconds slice) override { return wait_slice(*work_, slice) == SliceResult::Done; }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

// Device-side work (NCCL): isCompleted() asks the GPU without blocking, so the caller can watch its
// peers in between; once complete, wait() orders the caller's stream after it and raises its error.
class PolledWork final : public TransportWork {
 public:
  explicit PolledWork(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  bool wait_for(std::chrono::milliseconds slice) override {
    const auto until = std::chrono::steady_clock::now() + slice;
    while (!work_->isCompleted()) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (const std::exception_ptr failure = work_->exception()) std::rethrow_exception(failure);
    work_->wait();
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

}  // namespace

std::unique_ptr<TransportWork> blocking_work(c10::intrusive_ptr<c10d::Work> work) {
  return std::make_unique<BlockingWork>(std::move(work));
}

C10dTransport::C10dTransport(c10::intrusive_ptr<C10dBackend> backend, const char* name, c10::Device device,
                             std::chrono::milliseconds backstop, std::function<void()> abort)
    : backend_(std::move(backend)), name_(name), device_(device), backstop_(backstop), abort_(std::move(abort)) {}

C10dTransport::~C10dTransport() {
  // An abandoned backend may still hold an operation that will never complete, which its destructor
  // would wait out (Gloo: up to the backstop): leave it, the process is about to report and exit.
  if (abandoned_) (void)backend_.release();
}

// Host-side work (Gloo) is waited on in slices; device-side work (NCCL) is polled.
std::unique_ptr<TransportWork> C10dTransport::wrap(c10::intrusive_ptr<c10d::Work> work) const {
  if (device_ == c10::DeviceType::CPU) return std::make_unique<BlockingWork>(std::move(work));
  return std::make_unique<PolledWork>(std::move(work));
}

std::unique_ptr<TransportWork> C10dTransport::all_reduce(at::Tensor& buffer, ReduceOp op) {
  std::vector<at::Tensor> one{buffer};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = backstop_;
  return wrap(backend_->allreduce(one, o));
}

std::unique_ptr<TransportWork> C10dTransport::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) {
  std::vector<std::vector<at::Tensor>> out{outputs};
  std::vector<at::Tensor> in{input};
  c10d::AllgatherOptions o;
  o.timeout = backstop_;
  return wrap(backend_->allgather(out, in, o));
}

std::unique_ptr<TransportWork> C10dTransport::broadcast(at::Tensor& buffer, int root) {
  std::vector<at::Tensor> one{buffer};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = backstop_;
  return wrap(backend_->broadcast(one, o));
}

std::unique_ptr<TransportWork> C10dTransport::gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                                     int root) {
  std::vector<std::vector<at::Tensor>> out;  // c10d: empty on the ranks that are not the root
  if (!outputs.empty()) out.push_back(outputs);
  std::vector<at::Tensor> in{input};
  c10d::GatherOptions o;
  o.rootRank = root;
  o.timeout = backstop_;
  return wrap(backend_->gather(out, in, o));
}

void C10dTransport::abandon() {
  if (abandoned_) return;
  abandoned_ = true;
  if (abort_) abort_();
}

}  // namespace lockstep::dist
#endif
