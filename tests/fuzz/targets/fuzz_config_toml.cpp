// Config files (`lockstep train --config`, RUN/config.toml on resume): any text loads or throws
// InvalidArgument or CorruptInput (nesting past the bound) and leaves the Config unchanged; what
// loads writes back to TOML that loads to the same values.
#include "fuzz_schema.h"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  train::Config config(fuzz::schema());
  try {
    config.load_toml_string(fuzz::input(data, size), "fuzz input");
  } catch (const InvalidArgument&) {
    fuzz::require(config.explicitly_set_keys().empty(), "a refused file changes nothing");
    return 0;
  } catch (const CorruptInput&) {
    fuzz::require(config.explicitly_set_keys().empty(), "a refused file changes nothing");
    return 0;
  }
  fuzz::require_round_trip(config);
  return 0;
}
