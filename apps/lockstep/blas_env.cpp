// Re-executes the program once with OPENBLAS_CORETYPE set, when OpenBLAS picked slow kernels.
#include "blas_env.h"

#include <strings.h>
#include <unistd.h>

#include <cstdlib>

#include "lockstep/core/machine.h"

namespace lockstep::cli {

void ensure_fast_blas(int argc, char** argv) {
  (void)argc;  // argv is null-terminated, which is all execv needs
  // A user's own OPENBLAS_CORETYPE always wins; the marker stops a second re-exec.
  if (std::getenv(kCoretypeEnv) || std::getenv(kNoReexecEnv) || std::getenv(kReexecMarkerEnv)) {
    return;
  }
  try {
    const BlasInfo blas = detect_blas();
    if (blas.vendor != "OpenBLAS") return;
    const std::string want = recommended_openblas_coretype(detect_cpu());
    if (want.empty() || strcasecmp(want.c_str(), blas.core.c_str()) == 0) return;
    if (setenv(kCoretypeEnv, want.c_str(), 1) == 0 && setenv(kReexecMarkerEnv, want.c_str(), 1) == 0) {
      // The real path first, so ps and top still say "lockstep" (exec'ing /proc/self/exe names the
      // process "exe"); /proc/self/exe still works if the binary was deleted since it started.
      char path[4096];
      const ssize_t len = readlink("/proc/self/exe", path, sizeof(path) - 1);
      if (len > 0) {
        path[len] = '\0';
        execv(path, argv);
      }
      execv("/proc/self/exe", argv);
    }
  } catch (...) {
    // Detection never throws by contract; if it ever does, run on with the BLAS as it is.
  }
  // Still here: exec failed (or setenv did). Undo, so the doctor reports the variable as unset.
  unsetenv(kCoretypeEnv);
  unsetenv(kReexecMarkerEnv);
}

std::string coretype_set_by_lockstep() {
  const char* marker = std::getenv(kReexecMarkerEnv);
  const char* coretype = std::getenv(kCoretypeEnv);
  if (!marker || !coretype || strcasecmp(marker, coretype) != 0) return "";
  return coretype;
}

}  // namespace lockstep::cli
