// Image files in a folder: lockstep's own header reader never throws or reads past the bytes, and
// probing (the truncation walk, PNG chunk filtering, then OpenCV) ends in a size or a reason.
#include "fuzz_check.h"
#include "lockstep/io/image_decode.h"
#include "lockstep/io/image_header.h"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = fuzz::input(data, size);
  const io::ImageHeader header = io::read_image_header(bytes);
  fuzz::require(header.error.empty() == (header.width > 0 && header.height > 0),
                "a header has a positive size exactly when it has no error");
  const std::string problem = io::image_header_problem(header);
  // Decoding a header within lockstep's limits may still take a GiB; keep the fuzzer's memory small.
  if (!problem.empty() || static_cast<uint64_t>(header.width) * static_cast<uint64_t>(header.height) > (1u << 22)) {
    return 0;
  }
  const io::ImageProbe probe = io::probe_image(bytes);
  fuzz::require(probe.error.empty() == (probe.width > 0 && probe.height > 0),
                "a probe has a size exactly when it has no error");
  return 0;
}
