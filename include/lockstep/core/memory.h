// Resident memory of this process, for benchmarks that report peak extra memory (Linux /proc).
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

// Current resident set size in bytes (VmRSS); 0 where /proc/self/status cannot be read.
int64_t resident_bytes();
// Peak resident set size in bytes since start or the last reset_peak_resident() (VmHWM).
int64_t peak_resident_bytes();
// Returns freed heap memory to the system (glibc), then starts a new peak (writes 5 to
// /proc/self/clear_refs, Linux >= 4.0). Call it before reading resident_bytes() as the baseline. Returns false where
// the kernel refuses; peak_resident_bytes() then keeps counting from the process start.
bool reset_peak_resident();

// Memory the system can still give (MemAvailable of /proc/meminfo), in bytes; -1 where unknown.
int64_t available_bytes();

// Throws InvalidArgument saying what needs how much, and what the machine has, when `bytes` exceed
// the memory available: a clear error before the allocation instead of a failed or killed one.
void check_fits_in_memory(double bytes, const std::string& what);

}  // namespace lockstep
