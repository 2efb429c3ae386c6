// IDX files of (Fashion-)MNIST, plain or gzip-compressed: any bytes decode or throw CorruptInput,
// and a decoded array holds exactly as many bytes as its dimensions say.
#include "fuzz_check.h"
#include "lockstep/data/idx.h"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parsed = fuzz::unless_refused([&] { return data::decode_idx(fuzz::input(data, size), "fuzz input"); });
  if (!parsed) return 0;
  const auto& array = *parsed;
  uint64_t elements = 1;
  for (int64_t d : array.dims) {
    fuzz::require(d > 0, "every dimension is positive");
    elements *= static_cast<uint64_t>(d);
  }
  fuzz::require(elements == array.data.size(), "the payload holds exactly the dimensions' product of bytes");
  return 0;
}
