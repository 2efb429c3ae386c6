#include "lockstep/core/memory.h"

#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {
// The "<field>: N kB" line of /proc/self/status, in bytes.
int64_t status_field_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}
}  // namespace

int64_t available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoll(line.substr(13)) * 1024;
  }
  return -1;
}

void check_fits_in_memory(double bytes, const std::string& what) {
  const int64_t available = available_bytes();
  if (available < 0 || bytes <= static_cast<double>(available)) return;
  const auto gib = [](double b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
    return std::string(text);
  };
  throw InvalidArgument(detail::concat(what, " needs ", gib(bytes), ", more than the ",
                                       gib(static_cast<double>(available)), " of memory this machine has available"));
}

int64_t resident_bytes() { return status_field_bytes("VmRSS"); }
int64_t peak_resident_bytes() { return status_field_bytes("VmHWM"); }

bool reset_peak_resident() {
#ifdef __GLIBC__
  malloc_trim(0);  // hand back freed heap memory first, else new allocations reuse it unseen
#endif
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace lockstep
