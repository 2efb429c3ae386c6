// NumPy .npy files (token files that `lockstep decode` reads): any bytes decode or throw
// CorruptInput, and what decodes re-encodes to bytes that decode to the same tensor.
#include "fuzz_check.h"
#include "lockstep/io/npy.h"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parsed = fuzz::unless_refused([&] { return io::decode_npy(fuzz::input(data, size), "fuzz input"); });
  if (!parsed) return 0;
  const auto& decoded = *parsed;
  fuzz::require(static_cast<size_t>(decoded.numel()) * io::dtype_size(decoded.dtype) == decoded.bytes.size(),
                "a decoded array holds exactly numel * dtype size bytes");
  const io::RawTensor again = io::decode_npy(io::encode_npy(decoded), "re-encoded");
  fuzz::require(again.dtype == decoded.dtype && again.shape == decoded.shape && again.bytes == decoded.bytes,
                "an array re-encodes to the same dtype, shape and bytes");
  return 0;
}
