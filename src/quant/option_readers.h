// Each option section's options struct, read through an OptionReader (option_specs.cpp, beside the
// section's declaration); the registry's entries build their quantizers from these.
#pragma once

#include <string>

#include "lockstep/quant/fsp.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/latent_quantize.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/option_reader.h"
#include "lockstep/quant/residual.h"
#include "lockstep/quant/simvq.h"
#include "lockstep/quant/vq.h"

namespace lockstep::quant::sections {

FsqOptions fsq_options(const OptionReader& o);
LfqOptions lfq_options(const OptionReader& o);
VqOptions vq_options(const OptionReader& o);
SimVqOptions simvq_options(const OptionReader& o);
LatentQuantizeOptions latent_options(const OptionReader& o);
FspOptions fsp_options(const OptionReader& o);
ResidualOptions residual_options(const OptionReader& o);
// The reader of section `name` beside `o`'s (InvalidArgument when `o` reads no other sections).
OptionReader section_of(const OptionReader& o, const std::string& name);

}  // namespace lockstep::quant::sections
