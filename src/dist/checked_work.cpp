#include "lockstep/dist/checked_work.h"

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/core/ivalue_inl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>

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

  void issued(c10::intrusive_ptr<c10d::Work> inner) {
    c10::intrusive_ptr<c10::ivalue::Future> theirs = inner->getFuture();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      inner_ = std::move(inner);
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

  // How a waiter gets its turn run: on its own thread when the worker has not taken it yet.
  void set_help(std::function<void()> help) { help_ = std::move(help); }

  // The check ran (and the collective was issued, unless it failed): the wrapped work, or the error.
  c10::intrusive_ptr<c10d::Work> after_turn() {
    if (help_) help_();
    std::unique_lock<std::mutex> lock(mutex_);
    turn_.wait(lock, [&] { return turned_; });
    if (error_) std::rethrow_exception(error_);
    return inner_;
  }

  bool wait(std::chrono::milliseconds timeout) override { return after_turn()->wait(timeout); }
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
  auto issue = [work, inner, tensors, options, stream](std::exception_ptr error) mutable {
    if (!error) {
      try {
        std::optional<c10::StreamGuard> on_callers_stream;
        if (stream) on_callers_stream.emplace(*stream);
        return work->issued(inner->allreduce(tensors, options));
      } catch (...) {
        error = std::current_exception();
      }
    }
    work->failed(error);
  };
  const std::shared_ptr<Group> group = channel.get(CallSite{call.tag.c_str(), call.file.c_str(), call.line});
  auto* checked = dynamic_cast<CheckedGroup*>(group.get());
  if (!checked) {  // a group of one process: checked and issued at once
    channel.check_then(call.op, call.compared, call.tag, call.file, call.line, call.compare_site, std::move(issue));
    return work;
  }
  const uint64_t turn = checked->check_foreign_then(call.op, call.compared, call.tag, call.file, call.line,
                                                    call.compare_site, std::move(issue));
  // Weakly: a Work that outlives its channel must not be what destroys it (with the GIL held, a Gloo
  // group's destructor can wait forever, see the bindings' delete_without_gil).
  work->set_help([weak = std::weak_ptr<Group>(group), checked, turn] {
    if (const std::shared_ptr<Group> alive = weak.lock()) checked->wait_for_turn(turn);
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
