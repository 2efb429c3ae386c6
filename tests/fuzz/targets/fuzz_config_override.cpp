// Command-line overrides (`--set key=value`, one per line of the input): each is applied or throws
// InvalidArgument and changes nothing; the result writes back to TOML that loads to the same values.
#include "fuzz_schema.h"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = fuzz::input(data, size);
  train::Config config(fuzz::schema());
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string before = config.to_toml();
    try {
      config.set_from_string(text.substr(start, end - start));
    } catch (const InvalidArgument&) {
      fuzz::require(config.to_toml() == before, "a refused override changes nothing");
    }
    start = end + 1;
  }
  fuzz::require_round_trip(config);
  return 0;
}
