// The quantizer benchmarks, defined once: `lockstep bench quantizers` and the Google Benchmark
// program (bench/) both run these cases. Not part of the library: a static library of their own.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace lockstep::bench {

enum class BenchLimit {
  Sgemm,      // work is floating-point operations; compare with the measured sgemm rate
  Bandwidth,  // work is bytes moved; compare with the measured memory bandwidth
};

struct BenchCase {
  std::string name;   // "vq fwd+bwd"
  std::string shape;  // "16x1024 d64 K512"
  BenchLimit limit = BenchLimit::Sgemm;
  double tokens = 0;    // tokens (or elements) per run, for tokens/s
  double work = 0;      // flops or bytes per run, as `limit` says
  std::string counted;  // how `work` is counted, one line
  // Our targets on the reference machine (docs/performance.md), one thread; 0 where there is none.
  double target_ms = 0;
  double target_fraction = 0;
  double target_extra_mib = 0;
  // Builds the inputs (not timed) and returns one run of the measured work; on a CUDA device a run
  // returns once the device has finished it.
  std::function<std::function<void()>()> prepare;
};

// On the CPU, or with cuda_device >= 0 the same cases on that CUDA device (the device-independent
// paths), less those that time a CPU kernel alone (writing into caller buffers).
std::vector<BenchCase> quantizer_bench_cases(int cuda_device = -1);

}  // namespace lockstep::bench
