#include "work_wait.h"

#if LOCKSTEP_HAVE_GLOO || TORCH_VERSION_MAJOR >= 2
namespace lockstep::dist {

SliceResult wait_slice(c10d::Work& work, std::chrono::milliseconds slice) {
  try {
    work.wait(slice);
    return SliceResult::Done;
  } catch (const std::exception&) {
    if (!work.isCompleted()) return SliceResult::Pending;  // the slice ran out
    if (const std::exception_ptr failure = work.exception()) std::rethrow_exception(failure);
    return SliceResult::Done;  // completed between the wait's timeout and our look
  }
}

}  // namespace lockstep::dist
#endif
