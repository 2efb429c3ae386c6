// Checking a quantizer's options without building it: the configuration's every quantizer section
// is checked when a run starts, the chosen quantizer's and the others' (a bad value is never kept).
#pragma once

#include <string>

#include "lockstep/quant/registry.h"

namespace lockstep::quant {

// The option section names: "fsq", "lfq", "vq", "residual".
const std::vector<std::string>& option_sections();
// Reads `section`'s options through `options` and validates them as the quantizer would, allocating
// nothing; throws InvalidArgument naming the option, or an unknown section.
void validate_options(const std::string& section, const OptionReader& options);

}  // namespace lockstep::quant
