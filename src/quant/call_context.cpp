#include "lockstep/quant/call_context.h"

#include <ATen/CPUGeneratorImpl.h>

#include "lockstep/core/random.h"

namespace lockstep::quant {

QuantizeContext seeded_context(uint64_t seed, uint64_t counter, int64_t first_item) {
  QuantizeContext ctx;
  ctx.generator = at::make_generator<at::CPUGeneratorImpl>(derive_seed(seed, counter, +SeedPurpose::Quantizer));
  ctx.first_item = first_item;
  return ctx;
}

}  // namespace lockstep::quant
