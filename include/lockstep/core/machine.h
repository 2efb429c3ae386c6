// What this machine is and how fast it runs: CPU features, the BLAS that LibTorch really uses,
// measured sgemm and memory bandwidth, and where the data sets are. `lockstep doctor` prints it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

struct CpuInfo {
  std::string model_name;  // e.g. "Intel(R) Xeon(R) Processor"; "unknown" if unreadable
  std::string vendor;      // cpuid vendor string, e.g. "GenuineIntel"
  int family = 0;          // display family (base + extended)
  int model = 0;           // display model (base + extended), e.g. 207
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  int logical_cores = 1;  // online logical CPUs this process may run on
};

// Reads cpuid (and /proc/cpuinfo for the model name). Never throws.
CpuInfo detect_cpu();

// The OPENBLAS_CORETYPE whose kernels suit `cpu`, or "" when OpenBLAS's own choice is fine.
std::string recommended_openblas_coretype(const CpuInfo& cpu);

struct BlasInfo {
  std::string library_path;  // real path of the loaded BLAS, "" if none was found
  std::string vendor;        // "OpenBLAS", "BLIS", "reference" or "unknown"
  std::string core;          // OpenBLAS's kernel set (openblas_get_corename), else ""
  std::string config;        // OpenBLAS's build configuration, else ""
  int threads = 0;           // the BLAS's own thread count, 0 when it cannot say
};

// Looks at the libraries loaded in this process (LibTorch loads the system libblas.so.3).
// Never throws.
BlasInfo detect_blas();

// Single-precision matrix product rate in GFLOP/s (2 n^3 per product) through torch::mm on
// n x n floats, with the threads set by at::set_num_threads. Median of the timed runs after a
// warm-up; runs for about `min_seconds`. Throws InvalidArgument for n < 1 or min_seconds < 0.
// cuda_device >= 0: the same on that CUDA device (each timed run ends with a device synchronise).
double measure_sgemm_gflops(int64_t n, double min_seconds, int cuda_device = -1);

// STREAM-triad bandwidth in GB/s (1e9 bytes): a = b + s * c over `elements` floats per array,
// counted as 3 * 4 bytes per element, through LibTorch on at::get_num_threads() threads. Use arrays much
// larger than the last-level cache. Median of the timed runs; throws InvalidArgument for
// elements < 1 or min_seconds < 0. cuda_device >= 0: the device memory's bandwidth instead.
double measure_triad_bandwidth_gbs(int64_t elements, double min_seconds, int cuda_device = -1);

}  // namespace lockstep
