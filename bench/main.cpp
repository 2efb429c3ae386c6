// The one entry point of lockstep_bench; each bench/*.cpp only registers its benchmarks.
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
