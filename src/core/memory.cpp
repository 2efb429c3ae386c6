#include "lockstep/core/memory.h"

#include <malloc.h>

#include <fstream>
#include <string>

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
