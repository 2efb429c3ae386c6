// Resident memory of this process, for benchmarks that report peak extra memory (Linux /proc).
#pragma once

#include <cstdint>

namespace lockstep {

// Current resident set size in bytes (VmRSS); 0 where /proc/self/status cannot be read.
int64_t resident_bytes();
// Peak resident set size in bytes since start or the last reset_peak_resident() (VmHWM).
int64_t peak_resident_bytes();
// Returns freed heap memory to the system (glibc), then starts a new peak (writes 5 to
// /proc/self/clear_refs, Linux >= 4.0). Call it before reading resident_bytes() as the baseline. Returns false where the
// kernel refuses; peak_resident_bytes() then keeps counting from the process start.
bool reset_peak_resident();

}  // namespace lockstep
