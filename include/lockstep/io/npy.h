// NumPy's .npy format (version 1.0/2.0), little-endian, C order: what `numpy.load` reads.
#pragma once

#include <string>

#include "lockstep/io/raw_tensor.h"

namespace lockstep::io {

std::string encode_npy(const RawTensor& tensor);
// Throws CorruptInput naming `origin` for a bad magic, header, dtype, Fortran order, or size.
RawTensor decode_npy(const std::string& bytes, const std::string& origin);

void save_npy(const std::string& path, const RawTensor& tensor);  // atomic
RawTensor load_npy(const std::string& path);

}  // namespace lockstep::io
