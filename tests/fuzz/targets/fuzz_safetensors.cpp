// safetensors files (checkpoints, and what `lockstep eval` and `encode` load): any bytes decode or
// throw CorruptInput, and what decodes re-encodes to bytes that decode to the same tensors.
#include "fuzz_check.h"
#include "lockstep/io/safetensors.h"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parsed =
      fuzz::unless_refused([&] { return io::decode_safetensors(fuzz::input(data, size), "fuzz input"); });
  if (!parsed) return 0;
  const auto& decoded = *parsed;
  const io::SafetensorsData again = io::decode_safetensors(io::encode_safetensors(decoded), "re-encoded");
  fuzz::require(again.metadata == decoded.metadata, "metadata survives a re-encoding");
  fuzz::require(again.tensors.size() == decoded.tensors.size(), "every tensor survives a re-encoding");
  for (const auto& [name, tensor] : decoded.tensors) {
    const io::RawTensor& t = again.at(name);
    fuzz::require(t.dtype == tensor.dtype && t.shape == tensor.shape && t.bytes == tensor.bytes,
                  "a tensor re-encodes to the same dtype, shape and bytes");
    fuzz::require(static_cast<size_t>(t.numel()) * io::dtype_size(t.dtype) == t.bytes.size(),
                  "a decoded tensor holds exactly numel * dtype size bytes");
  }
  return 0;
}
