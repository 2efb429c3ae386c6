// Machine detection and measurement: sane values only. Speeds are never asserted (shared hosts).
#include "lockstep/core/machine.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

TEST(DetectCpu, ReportsSaneValues) {
  const CpuInfo cpu = detect_cpu();
  EXPECT_FALSE(cpu.model_name.empty());
  EXPECT_GE(cpu.logical_cores, 1);
#if defined(__x86_64__)
  EXPECT_GE(cpu.family, 1);
  EXPECT_FALSE(cpu.vendor.empty());
  // Every AVX-512 subset implies the foundation, and AVX-512 hardware has AVX2 and FMA.
  if (cpu.avx512bw || cpu.avx512vl || cpu.avx512dq || cpu.avx512_bf16) EXPECT_TRUE(cpu.avx512f);
  if (cpu.avx512f) {
    EXPECT_TRUE(cpu.avx2);
    EXPECT_TRUE(cpu.fma);
  }
#endif
}

TEST(RecommendedCoretype, FollowsFeatureFlags) {
  CpuInfo none;
  EXPECT_EQ(recommended_openblas_coretype(none), "");
  CpuInfo avx2 = none;
  avx2.avx2 = avx2.fma = true;
  EXPECT_EQ(recommended_openblas_coretype(avx2), "Haswell");
  CpuInfo only_avx2 = none;
  only_avx2.avx2 = true;  // no FMA: Haswell kernels would fault
  EXPECT_EQ(recommended_openblas_coretype(only_avx2), "");
  CpuInfo skx = avx2;
  skx.avx512f = skx.avx512bw = skx.avx512vl = skx.avx512dq = true;
  EXPECT_EQ(recommended_openblas_coretype(skx), "SkylakeX");
  CpuInfo partial = avx2;
  partial.avx512f = true;  // Knights Landing style: no BW/VL/DQ, so not SkylakeX
  EXPECT_EQ(recommended_openblas_coretype(partial), "Haswell");
}

TEST(RecommendedCoretype, ConsistentWithThisCpu) {
  const CpuInfo cpu = detect_cpu();
  const std::string want = recommended_openblas_coretype(cpu);
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq) {
    EXPECT_EQ(want, "SkylakeX");
  } else if (cpu.avx2 && cpu.fma) {
    EXPECT_EQ(want, "Haswell");
  } else {
    EXPECT_EQ(want, "");
  }
}

// Whether this process mapped a shared BLAS, read from /proc/self/maps (not how detect_blas looks).
bool maps_a_shared_blas() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const std::string base = std::filesystem::path(line.substr(line.find_last_of(' ') + 1)).filename().string();
    for (const char* prefix : {"libblas.so", "libopenblas", "libblis"}) {
      if (base.rfind(prefix, 0) == 0) return true;
    }
  }
  return false;
}

TEST(DetectBlas, FindsTheBlasLibTorchLoaded) {
  const BlasInfo blas = detect_blas();
  if (!maps_a_shared_blas()) {  // a LibTorch with MKL linked in (the GPU machines' torch): nothing to name
    EXPECT_EQ(blas.vendor, "unknown");
    EXPECT_TRUE(blas.library_path.empty()) << blas.library_path;
    return;
  }
  // This machine's setup (machine.md) installs libopenblas0-openmp as the libblas.so.3 alternative.
  ASSERT_EQ(blas.vendor, "OpenBLAS") << "loaded BLAS: '" << blas.library_path << "'";
  EXPECT_TRUE(std::filesystem::exists(blas.library_path)) << blas.library_path;
  EXPECT_FALSE(blas.core.empty());
  EXPECT_NE(blas.config.find("OpenBLAS"), std::string::npos) << blas.config;
  EXPECT_GE(blas.threads, 1);
}

TEST(MeasureSgemm, PositiveAndFiniteForSmallSizes) {
  for (int64_t n : {1, 17, 64}) {
    const double gflops = measure_sgemm_gflops(n, 0.0);
    EXPECT_TRUE(std::isfinite(gflops)) << "n=" << n;
    EXPECT_GT(gflops, 0.0) << "n=" << n;
  }
}

TEST(MeasureSgemm, LeavesTheGlobalRandomStreamAlone) {
  torch::manual_seed(7);
  const auto expected = torch::rand({8});
  torch::manual_seed(7);
  measure_sgemm_gflops(16, 0.0);
  EXPECT_TRUE(torch::equal(torch::rand({8}), expected));
}

TEST(MeasureSgemm, RejectsBadArguments) {
  EXPECT_THROW(measure_sgemm_gflops(0, 0.0), InvalidArgument);
  EXPECT_THROW(measure_sgemm_gflops(8, -1.0), InvalidArgument);
}

TEST(MeasureTriad, PositiveAndFiniteWithOneAndTwoThreads) {
  const int saved = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (int64_t elements : {1, 1000, 1 << 20}) {
      const double gbs = measure_triad_bandwidth_gbs(elements, 0.0);
      EXPECT_TRUE(std::isfinite(gbs)) << "elements=" << elements << " threads=" << threads;
      EXPECT_GT(gbs, 0.0) << "elements=" << elements << " threads=" << threads;
    }
  }
  at::set_num_threads(saved);
}

TEST(MeasureTriad, RejectsBadArguments) {
  EXPECT_THROW(measure_triad_bandwidth_gbs(0, 0.0), InvalidArgument);
  EXPECT_THROW(measure_triad_bandwidth_gbs(16, -0.5), InvalidArgument);
}

}  // namespace
}  // namespace lockstep
