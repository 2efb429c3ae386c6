// The machine's own limits on one thread: sgemm GFLOP/s and triad memory bandwidth, to read
// every other benchmark's figures against. Compare with `lockstep doctor`.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <memory>

#include "lockstep/core/machine.h"

namespace {

void add_machine_context(benchmark::State& state) {
  const auto blas = lockstep::detect_blas();
  state.SetLabel(blas.vendor + (blas.core.empty() ? "" : " " + blas.core) + ", 1 thread");
}

void BM_Sgemm(benchmark::State& state) {
  at::set_num_threads(1);
  torch::NoGradGuard no_grad;
  const int64_t n = state.range(0);
  const auto a = torch::randn({n, n});
  const auto b = torch::randn({n, n});
  auto c = torch::empty({n, n});
  torch::mm_out(c, a, b);  // warm-up
  for (auto _ : state) {
    torch::mm_out(c, a, b);
    benchmark::DoNotOptimize(c.data_ptr<float>());
  }
  const double flop = 2.0 * double(n) * double(n) * double(n);
  state.counters["GFLOP"] = benchmark::Counter(flop * 1e-9 * double(state.iterations()), benchmark::Counter::kIsRate);
  add_machine_context(state);
}
BENCHMARK(BM_Sgemm)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Triad(benchmark::State& state) {
  at::set_num_threads(1);
  const int64_t n = state.range(0);
  // Value-initialised: every page is touched before timing starts.
  std::unique_ptr<float[]> a(new float[n]()), b(new float[n]()), c(new float[n]());
  const float s = 3.0f;
  for (auto _ : state) {
    float* __restrict pa = a.get();
    const float* __restrict pb = b.get();
    const float* __restrict pc = c.get();
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
    benchmark::ClobberMemory();
  }
  // STREAM's convention: 3 arrays * 4 bytes per element (write-allocate traffic not counted).
  state.SetBytesProcessed(int64_t(state.iterations()) * 3 * int64_t(sizeof(float)) * n);
  add_machine_context(state);
}
// 3 x 256 MiB: far above the 260 MB L3 of this Xeon generation.
BENCHMARK(BM_Triad)->Arg(int64_t{64} << 20)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
