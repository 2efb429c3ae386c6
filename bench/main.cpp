// The one entry point of lockstep_bench (each bench/*.cpp only registers its benchmarks). Like
// BENCHMARK_MAIN(), plus the BLAS in use in the printed context: it changes sgemm speed 5x.
#include <benchmark/benchmark.h>
#include <strings.h>

#include <string>

#include "lockstep/core/machine.h"

int main(int argc, char** argv) {
  const lockstep::BlasInfo blas = lockstep::detect_blas();
  const std::string want = lockstep::recommended_openblas_coretype(lockstep::detect_cpu());
  benchmark::AddCustomContext("blas", blas.vendor + (blas.core.empty() ? "" : " " + blas.core) + " (" +
                                          (blas.library_path.empty() ? "none found" : blas.library_path) + ")");
  // Unlike the lockstep tool, this program does not re-execute itself: say how to get the speed.
  if (blas.vendor == "OpenBLAS" && !want.empty() && strcasecmp(want.c_str(), blas.core.c_str()) != 0) {
    benchmark::AddCustomContext("blas_warning", "OpenBLAS runs its " + blas.core + " kernels; run with " +
                                                    "OPENBLAS_CORETYPE=" + want + " for this CPU's speed");
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
