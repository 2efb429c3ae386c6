// ProcessGroupGloo.hpp with the gloo headers Debian ships (libgloo-dev, from 2022), for both
// LibTorch 1.13 and 2.x. PyPI's wheels carry no gloo headers, and 2.x's GlooStore (an adapter that
// lockstep never constructs) overrides gloo Store methods added after 2022, so for that header
// alone `override` is dropped: the classes lockstep uses are declared exactly as before, and only
// the adapter's extra methods become plain member functions instead of a compile error.
#pragma once

#include <gloo/algorithm.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Utils.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/logger.hpp>
#pragma push_macro("override")
#define override
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#pragma pop_macro("override")
#else
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
