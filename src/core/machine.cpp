// Machine detection (cpuid, the loaded BLAS, data files) and two quick speed measurements.
#include "lockstep/core/machine.h"

#include <ATen/CPUGeneratorImpl.h>
#include <dlfcn.h>
#include <link.h>
#include <sched.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "lockstep/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define LOCKSTEP_X86 1
#else
#define LOCKSTEP_X86 0
#endif

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string model_name_from_proc() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        const auto start = line.find_first_not_of(" \t", colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
      }
    }
  }
  return "";
}

int count_logical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

#if LOCKSTEP_X86
// XCR0: which register states the OS saves. AVX needs bits 1-2, AVX-512 also bits 5-7; without
// them the instructions fault even though cpuid lists them.
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

void fill_from_cpuid(CpuInfo& info) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  info.vendor = vendor;

  __get_cpuid(1, &a, &b, &c, &d);
  const int base_family = (a >> 8) & 0xf;
  const int base_model = (a >> 4) & 0xf;
  info.family = base_family == 0xf ? base_family + int((a >> 20) & 0xff) : base_family;
  info.model = (base_family == 0x6 || base_family == 0xf) ? base_model + int(((a >> 16) & 0xf) << 4) : base_model;
  const bool osxsave = c & (1u << 27);
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  info.fma = os_avx && (c & (1u << 12));

  if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    const unsigned max_subleaf = a;
    info.avx2 = os_avx && (b & (1u << 5));
    info.avx512f = os_avx512 && (b & (1u << 16));
    info.avx512dq = os_avx512 && (b & (1u << 17));
    info.avx512bw = os_avx512 && (b & (1u << 30));
    info.avx512vl = os_avx512 && (b & (1u << 31));
    if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
      info.avx512_bf16 = os_avx512 && (a & (1u << 5));
    }
  }

  if (info.model_name.empty() && __get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    char brand[49] = {};
    for (size_t i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + static_cast<unsigned>(i), &a, &b, &c, &d);
      char* out = brand + 16 * i;
      std::memcpy(out, &a, 4);
      std::memcpy(out + 4, &b, 4);
      std::memcpy(out + 8, &c, 4);
      std::memcpy(out + 12, &d, 4);
    }
    std::string s = brand;
    const auto start = s.find_first_not_of(' ');
    info.model_name = start == std::string::npos ? "" : s.substr(start);
  }
}
#endif

// Paths (as the loader names them) of every object loaded in this process.
std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name && info->dlpi_name[0]) {
          static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name);
        }
        return 0;
      },
      &names);
  return names;
}

std::string real_path(const std::string& path) {
  std::error_code ec;
  auto p = std::filesystem::canonical(path, ec);
  return ec ? path : p.string();
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Looks `symbol` up in an already loaded object and its dependencies, never loading anything.
void* find_symbol(const std::string& object, const char* symbol) {
  void* handle = dlopen(object.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) return nullptr;
  void* sym = dlsym(handle, symbol);
  dlclose(handle);  // only drops the reference RTLD_NOLOAD added
  return sym;
}

std::string or_empty(const char* s) { return s ? s : ""; }

}  // namespace

CpuInfo detect_cpu() {
  CpuInfo info;
  info.model_name = model_name_from_proc();
#if LOCKSTEP_X86
  fill_from_cpuid(info);
#endif
  if (info.model_name.empty()) info.model_name = "unknown";
  info.logical_cores = count_logical_cores();
  return info;
}

std::string recommended_openblas_coretype(const CpuInfo& cpu) {
  // Not Cooperlake or SapphireRapids even where they fit the CPU: OpenBLAS 0.3.21 runs sgemm on
  // those with SkylakeX's kernels, and older OpenBLAS builds do not know their names at all.
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return "Haswell";
  return "";
}

BlasInfo detect_blas() {
  std::string libblas, openblas, blis;
  for (const auto& name : loaded_objects()) {
    const std::string base = std::filesystem::path(name).filename().string();
    if (libblas.empty() && starts_with(base, "libblas.so")) libblas = name;
    if (openblas.empty() && starts_with(base, "libopenblas")) openblas = name;
    if (blis.empty() && starts_with(base, "libblis")) blis = name;
  }
  BlasInfo info;
  info.vendor = "unknown";
  // libblas.so.3 is what LibTorch calls; its real path shows which alternative is selected.
  const std::string primary = !libblas.empty() ? libblas : !openblas.empty() ? openblas : blis;
  if (primary.empty()) return info;
  info.library_path = real_path(primary);

  using NameFn = char* (*)();
  using CountFn = int (*)();
  if (auto corename = reinterpret_cast<NameFn>(find_symbol(primary, "openblas_get_corename"))) {
    info.vendor = "OpenBLAS";
    info.core = or_empty(corename());
    if (auto config = reinterpret_cast<NameFn>(find_symbol(primary, "openblas_get_config"))) {
      info.config = or_empty(config());
    }
    if (auto threads = reinterpret_cast<CountFn>(find_symbol(primary, "openblas_get_num_threads"))) {
      info.threads = threads();
    }
  } else if (!blis.empty() || find_symbol(primary, "bli_info_get_version_str")) {
    info.vendor = "BLIS";
    if (auto threads = reinterpret_cast<CountFn>(find_symbol(primary, "bli_thread_get_num_threads"))) {
      info.threads = threads();
    }
  } else if (info.library_path.find("/blas/libblas.so") != std::string::npos) {
    // Debian's netlib reference BLAS lives in .../blas/; it is single-threaded.
    info.vendor = "reference";
    info.threads = 1;
  }
  return info;
}

namespace {
at::Device device_of(int cuda_device) {
  return cuda_device < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device));
}
// Work queued on a CUDA device is finished before the clock is read.
void finish(int cuda_device) {
  if (cuda_device >= 0) torch::cuda::synchronize(cuda_device);
}
}  // namespace

double measure_sgemm_gflops(int64_t n, double min_seconds, int cuda_device) {
  LOCKSTEP_CHECK_ARG(n >= 1, "measure_sgemm_gflops: n must be >= 1, got ", n);
  LOCKSTEP_CHECK_ARG(min_seconds >= 0, "measure_sgemm_gflops: min_seconds must be >= 0, got ", min_seconds);
  torch::NoGradGuard no_grad;
  // A private generator: measuring must not move the global RNG that training seeds.
  auto gen = at::detail::createCPUGenerator(42);
  const auto a = torch::randn({n, n}, gen).to(device_of(cuda_device));
  const auto b = torch::randn({n, n}, gen).to(device_of(cuda_device));
  auto c = torch::empty({n, n}, a.options());
  torch::mm_out(c, a, b);  // warm-up: thread pools, page faults, BLAS buffers (cuBLAS handles)
  finish(cuda_device);
  auto t0 = Clock::now();
  torch::mm_out(c, a, b);
  finish(cuda_device);
  // Small products are repeated inside one sample so the clock's resolution does not dominate.
  const double warm = std::max(seconds_since(t0), 1e-9);
  const int reps = static_cast<int>(std::clamp(1e-3 / warm, 1.0, 1000.0));
  const double flop = 2.0 * double(n) * double(n) * double(n) * reps;

  std::vector<double> rates;
  const auto start = Clock::now();
  while (rates.size() < 3 || seconds_since(start) < min_seconds) {
    t0 = Clock::now();
    for (int r = 0; r < reps; ++r) torch::mm_out(c, a, b);
    finish(cuda_device);
    rates.push_back(flop / std::max(seconds_since(t0), 1e-9) / 1e9);
  }
  return median(rates);
}

double measure_triad_bandwidth_gbs(int64_t elements, double min_seconds, int cuda_device) {
  LOCKSTEP_CHECK_ARG(elements >= 1, "measure_triad_bandwidth_gbs: elements must be >= 1, got ", elements);
  LOCKSTEP_CHECK_ARG(min_seconds >= 0, "measure_triad_bandwidth_gbs: min_seconds must be >= 0, got ", min_seconds);
  // LibTorch's own kernels, not a loop here: ATen's inline at::parallel_for runs serially in code
  // built without -fopenmp, while add_out is vectorised and split over at::get_num_threads().
  torch::NoGradGuard no_grad;
  const auto on = torch::TensorOptions().device(device_of(cuda_device));
  auto a = torch::empty({elements}, on);
  const auto b = torch::full({elements}, 1.0f, on);  // filled in parallel: pages touched before timing
  const auto c = torch::full({elements}, 2.0f, on);
  const double s = 3.0;
  torch::add_out(a, b, c, s);  // warm-up; also touches a's pages
  finish(cuda_device);
  const double bytes = 3.0 * sizeof(float) * double(elements);
  std::vector<double> rates;
  const auto start = Clock::now();
  while (rates.size() < 3 || seconds_since(start) < min_seconds) {
    const auto t0 = Clock::now();
    torch::add_out(a, b, c, s);  // a = b + s * c
    finish(cuda_device);
    rates.push_back(bytes / std::max(seconds_since(t0), 1e-9) / 1e9);
  }
  return median(rates);
}

}  // namespace lockstep
