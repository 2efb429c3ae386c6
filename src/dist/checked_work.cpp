#include "lockstep/dist/checked_work.h"

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/core/ivalue_inl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>

#include "c10d_transport.h"
#include "checked_group.h"

namespace lockstep::dist {
namespace {

// Returned at once; completed by the channel's worker: issued() with the wrapped group's work, whose
// future then completes this one's, or failed() with the check's error.
class CheckedWork final : public c10d::Work {
 public:
  explicit CheckedWork(const std::vector<at::Tensor>& tensors) : c10d::Work(-1, c10d::OpType::ALLREDUCE) {
    std::vector<c10::Device> devices;
    if (!tensors.empty() && !tensors[0].is_cpu()) devices.push_back(tensors[0].device());
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  }

  // `predicted`: its check passed on the prediction; its waiters watch it through the channel.
  void issued(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<const CollectiveCall> predicted) {
    c10::intrusive_ptr<c10::ivalue::Future> theirs = inner->getFuture();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      inner_ = std::move(inner);
      predicted_ = std::move(predicted);
      turned_ = true;
    }
    turn_.notify_all();
    // Runs on whichever thread completes theirs (with its streams current, for CUDA).
    theirs->addCallback([ours = future_](c10::ivalue::Future& done) {
      if (done.hasError()) {
        ours->setError(done.exception_ptr());
      } else {
        ours->markCompleted(done.value(), done.storages());
      }
    });
  }

  void failed(std::exception_ptr error) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      turned_ = true;
    }
    turn_.notify_all();
    future_->setError(error);
  }

  // How a waiter gets its turn run: on its own thread when the worker has not taken it yet; `watch`, how
  // it waits for a collective issued on the prediction.
  void set_help(std::function<void()> help, std::function<void(c10::intrusive_ptr<c10d::Work>, const CollectiveCall&,
                                                               std::optional<std::chrono::milliseconds>)>
                                                watch) {
    help_ = std::move(help);
    watch_ = std::move(watch);
  }

  // The check ran (and the collective was issued, unless it failed): the wrapped work, or the error.
  // Issued on the prediction, the wrapped work has completed too (or `limit` passed), or a rank departed
  // from it (raised).
  c10::intrusive_ptr<c10d::Work> after_turn(std::optional<std::chrono::milliseconds> limit = std::nullopt) {
    if (help_) help_();
    std::shared_ptr<const CollectiveCall> predicted;
    c10::intrusive_ptr<c10d::Work> inner;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      turn_.wait(lock, [&] { return turned_; });
      if (error_) std::rethrow_exception(error_);
      predicted = predicted_;
      inner = inner_;
    }
    if (predicted && watch_) watch_(inner, *predicted, limit);
    return inner;
  }

  // A caller's own timeout bounds the watch too; the wrapped work's wait, given what is left of it, then
  // says it timed out.
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout == kNoTimeout) return after_turn()->wait(timeout);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    c10::intrusive_ptr<c10d::Work> inner = after_turn(timeout);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return inner->wait(std::max(left, std::chrono::milliseconds(1)));
  }
  void synchronize() override { after_turn()->synchronize(); }
  std::vector<at::Tensor> result() override { return after_turn()->result(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }

 private:
  std::function<void()> help_;  // set before the Work is handed out
  std::function<void(c10::intrusive_ptr<c10d::Work>, const CollectiveCall&, std::optional<std::chrono::milliseconds>)>
      watch_;
  std::shared_ptr<const CollectiveCall> predicted_;
  std::mutex mutex_;
  std::condition_variable turn_;
  bool turned_ = false;
  std::exception_ptr error_;
  c10::intrusive_ptr<c10d::Work> inner_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

// On the worker, the collective is issued on the caller's stream (CUDA), so that it follows what the
// caller queued before the call.
c10::intrusive_ptr<c10d::Work> all_reduce_after_check(LazyGroup& channel, ForeignCall call,
                                                      c10::intrusive_ptr<c10d::ProcessGroup> inner,
                                                      std::vector<at::Tensor> tensors,
                                                      const c10d::AllreduceOptions& options) {
  auto work = c10::make_intrusive<CheckedWork>(tensors);
  std::optional<c10::Stream> stream;
  if (!tensors.empty() && !tensors[0].is_cpu())
    stream = c10::impl::VirtualGuardImpl(tensors[0].device().type()).getStream(tensors[0].device());
  auto issue = [work, inner, tensors, options, stream](std::exception_ptr error,
                                                       std::shared_ptr<const CollectiveCall> predicted) mutable {
    if (!error) {
      try {
        std::optional<c10::StreamGuard> on_callers_stream;
        if (stream) on_callers_stream.emplace(*stream);
        return work->issued(inner->allreduce(tensors, options), std::move(predicted));
      } catch (...) {
        error = std::current_exception();
      }
    }
    work->failed(error);
  };
  const std::shared_ptr<Group> group = channel.get(CallSite{call.tag.c_str(), call.file.c_str(), call.line});
  auto* checked = dynamic_cast<CheckedGroup*>(group.get());
  if (!checked) {  // a group of one process: checked and issued at once
    channel.check_then(call.op, call.compared, call.tag, call.file, call.line, call.compare_site,
                       [issue](std::exception_ptr error) mutable { issue(error, nullptr); });
    return work;
  }
  // A device's collective (NCCL) is never predicted: watching it would wait for the device on the host.
  const bool on_host = tensors.empty() || tensors[0].is_cpu();
  const uint64_t turn =
      on_host ? checked->check_foreign_then_watched(call.op, call.compared, call.tag, call.file, call.line,
                                                    call.compare_site, std::move(issue))
              : checked->check_foreign_then(call.op, call.compared, call.tag, call.file, call.line, call.compare_site,
                                            [issue](std::exception_ptr error) mutable { issue(error, nullptr); });
  // Weakly: a Work that outlives its channel must not be what destroys it (with the GIL held, a Gloo
  // group's destructor can wait forever, see the bindings' delete_without_gil).
  const std::weak_ptr<Group> weak = group;
  work->set_help(
      [weak, checked, turn] {
        if (const std::shared_ptr<Group> alive = weak.lock()) checked->wait_for_turn(turn);
      },
      [weak, checked](c10::intrusive_ptr<c10d::Work> issued, const CollectiveCall& predicted,
                      std::optional<std::chrono::milliseconds> limit) {
        const std::shared_ptr<Group> alive = weak.lock();
        if (!alive) return;
        const auto waited = blocking_work(std::move(issued));
        checked->finish_watched(*waited, predicted, limit);
      });
  return work;
}

bool raise_if_check_failed(c10d::Work& work) {
  auto* checked = dynamic_cast<CheckedWork*>(&work);
  if (!checked) return false;
  (void)checked->after_turn();
  return true;
}

}  // namespace lockstep::dist
#endif
