// Waiting for a c10d::Work in slices, so that the caller can watch its peers in between.
#pragma once

#include "lockstep/config_build.h"

#if LOCKSTEP_HAVE_GLOO  // c10d comes with the distributed build of LibTorch that Gloo needs
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
