// VQ's nearest-code search on one thread (BM_NearestCode also on two; the VQ training step is BM_Quantizer/vq fwd+bwd),
// beside BM_Sgemm (bench_machine.cpp): the fused search should run near sgemm speed, the unfused one
// does not. Set OPENBLAS_CORETYPE as bench/main.cpp advises: BM_Sgemm and the unfused search use BLAS.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lockstep/quant/nearest_code.h"
#include "quant/nearest_code_kernels.h"

namespace {

using lockstep::quant::Metric;

// Counters for a search of n tokens over k codes of dimension d: 2 n k d flops per search.
void search_counters(benchmark::State& state, int64_t n, int64_t k, int64_t d) {
  const double flop = 2.0 * double(n) * double(k) * double(d);
  state.counters["GFLOP"] = benchmark::Counter(flop * 1e-9 * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["tokens"] = benchmark::Counter(double(n) * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel("1 thread");
}

// args: tokens, codes, dim, threads
void BM_NearestCode(benchmark::State& state) {
  const int threads = state.range(3);
  at::set_num_threads(threads);
  const int64_t n = state.range(0), k = state.range(1), d = state.range(2);
  const at::Tensor x = torch::randn({n, d});
  const at::Tensor codebook = torch::randn({k, d});
  for (auto _ : state) {
    auto found = lockstep::quant::nearest_code(x, codebook, Metric::Euclidean);
    benchmark::DoNotOptimize(found.indices.data_ptr<int64_t>());
  }
  search_counters(state, n, k, d);
  state.SetLabel(std::to_string(threads) + (threads == 1 ? " thread" : " threads"));
  at::set_num_threads(1);
}
BENCHMARK(BM_NearestCode)
    ->Args({16384, 512, 64, 1})
    ->Args({16384, 512, 64, 2})
    ->Args({16384, 1024, 256, 1})
    ->Args({16384, 8192, 32, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Each kernel nearest_code can pick (it runs the first this CPU supports), one thread.
// args: kernel (0 avx512, 1 avx2, 2 generic), tokens, codes, dim
void BM_NearestCodeKernel(benchmark::State& state) {
  static const char* const names[] = {"avx512", "avx2", "generic"};
  const std::string kernel = names[state.range(0)];
  const std::vector<std::string> supported = lockstep::quant::detail::nearest_code_kernels();
  if (std::find(supported.begin(), supported.end(), kernel) == supported.end()) {
    state.SkipWithError((kernel + " does not run on this CPU").c_str());
    return;
  }
  at::set_num_threads(1);
  const int64_t n = state.range(1), k = state.range(2), d = state.range(3);
  const at::Tensor x = torch::randn({n, d});
  const at::Tensor codebook = torch::randn({k, d});
  for (auto _ : state) {
    auto found = lockstep::quant::detail::nearest_code_with_kernel(x, codebook, Metric::Euclidean, kernel);
    benchmark::DoNotOptimize(found.indices.data_ptr<int64_t>());
  }
  search_counters(state, n, k, d);
  state.SetLabel(kernel + ", 1 thread");
}
BENCHMARK(BM_NearestCodeKernel)
    ->ArgsProduct({{0, 1, 2}, {16384}, {512}, {64}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The unfused baseline: the whole n x k matrix |e|^2 - 2 x.e, then torch's argmin.
void BM_NearestCodeUnfused(benchmark::State& state) {
  at::set_num_threads(1);
  torch::NoGradGuard no_grad;
  const int64_t n = state.range(0), k = state.range(1), d = state.range(2);
  const at::Tensor x = torch::randn({n, d});
  const at::Tensor codebook = torch::randn({k, d});
  const at::Tensor norms = codebook.pow(2).sum(1);
  for (auto _ : state) {
    const at::Tensor idx = torch::addmm(norms, x, codebook.t(), 1, -2).argmin(1);
    benchmark::DoNotOptimize(idx.data_ptr<int64_t>());
  }
  search_counters(state, n, k, d);
}
BENCHMARK(BM_NearestCodeUnfused)->Args({16384, 512, 64})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
