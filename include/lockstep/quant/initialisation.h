// Whether a quantizer still initialises state from the data of its first training call.
#pragma once

#include "lockstep/quant/quantizer.h"

namespace lockstep::quant {

// True while a training call of `quantizer` would first initialise state from its batch: VQ's
// k-means (kmeans_init) not yet run, in it or in any layer or group of a residual or grouped
// quantizer. A caller that splits a batch into passes (train.shard_size) then hands it the whole
// batch once before them.
bool awaits_initialisation(const Quantizer& quantizer);

}  // namespace lockstep::quant
