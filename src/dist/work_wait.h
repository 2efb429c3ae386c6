// Waiting for a c10d::Work in slices, so that the caller can watch its peers in between.
#pragma once

#include "lockstep/config_build.h"

#include <torch/version.h>
// c10d comes with LibTorch 2, and with a 1.13 whose Gloo headers were found.
#if LOCKSTEP_HAVE_GLOO || TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>

namespace lockstep::dist {

enum class SliceResult { Done, Pending };

// Waits up to `slice` for `work`: Done when it completed with success, also when it completed just
// as the wait gave up (Work::wait then throws "Operation timed out!" although the work succeeded);
// Pending while it runs. Rethrows the work's own exception when it failed.
SliceResult wait_slice(c10d::Work& work, std::chrono::milliseconds slice);

}  // namespace lockstep::dist
#endif
