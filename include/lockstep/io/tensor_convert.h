// Conversions between torch tensors and RawTensor, the bridge between models and file formats.
#pragma once

#include <ATen/core/Tensor.h>

#include "lockstep/io/raw_tensor.h"

namespace lockstep::io {

// A contiguous CPU copy of `t` (any device, any strides). Throws InvalidArgument for dtypes that
// RawTensor cannot hold (complex, quantized, unsigned wider than 8 bits).
RawTensor to_raw(const at::Tensor& t);

// A new CPU tensor owning a copy of `r`'s bytes. Throws CorruptInput when the byte count does not
// match shape and dtype, or a dimension is negative.
at::Tensor from_raw(const RawTensor& r);

}  // namespace lockstep::io
