// The context of one quantizer call whose randomness every holder of the batch agrees on with no
// collective: the trainer's calls and the Python modules' are made here, one way.
#pragma once

#include <cstdint>

#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

// A QuantizeContext whose generator is derive_seed(seed, counter, SeedPurpose::Quantizer) and whose
// tokens start at `first_item` of the global batch. The trainer counts micro-batches (step x
// micro-batches + micro-batch); a Python module counts its completed training steps.
QuantizeContext seeded_context(uint64_t seed, uint64_t counter, int64_t first_item = 0);

}  // namespace lockstep::quant
