// A CPU generator from a seed, for tests that need the same random draws twice.
#pragma once

#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>

namespace lockstep::quant::test_util {

inline at::Generator seeded(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

}  // namespace lockstep::quant::test_util
