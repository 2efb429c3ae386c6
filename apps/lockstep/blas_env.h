// Makes OpenBLAS use the right kernels. OpenBLAS 0.3.21 reads OPENBLAS_CORETYPE only when it
// loads, and misdetects recent Xeons (sgemm 3-5x slow), so the fix is to re-execute once.
#pragma once

#include <string>

namespace lockstep::cli {

// Environment variables involved, named once for the doctor and the tests.
constexpr const char* kCoretypeEnv = "OPENBLAS_CORETYPE";
constexpr const char* kNoReexecEnv = "LOCKSTEP_NO_REEXEC";        // set (to anything) to opt out
constexpr const char* kReexecMarkerEnv = "LOCKSTEP_BLAS_REEXEC";  // holds the core type we set

// Call first in main(). When OPENBLAS_CORETYPE is unset, the loaded BLAS is OpenBLAS running a
// core type other than the one this CPU should use, and neither LOCKSTEP_NO_REEXEC nor the
// marker is set: sets OPENBLAS_CORETYPE and the marker, then execv's /proc/self/exe with the same
// argv. Returns (doing nothing) otherwise, and also when execv fails. Never throws.
void ensure_fast_blas(int argc, char** argv);

// The core type lockstep put into OPENBLAS_CORETYPE by re-executing (here or in a parent
// lockstep process), or "" when OPENBLAS_CORETYPE is unset or came from the user.
std::string coretype_set_by_lockstep();

}  // namespace lockstep::cli
