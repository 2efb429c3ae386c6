// FSQ's fused kernel on one thread beside what it replaced (the torch-op chain), and its forward read
// against the copy and triad bandwidth measured in the same run.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "lockstep/core/machine.h"
#include "lockstep/quant/fsq.h"

namespace {

using lockstep::quant::Fsq;
using lockstep::quant::FsqOptions;

const std::vector<int64_t> kLevels = {8, 5, 5, 5};

// The quantize forward + backward at 16 x 1024 tokens as the chain of torch ops the fused kernel
// replaced (default bound, then indices); the kernel's own figure is BM_Quantizer/fsq fwd+bwd.
void BM_FsqForwardBackwardTorchOps(benchmark::State& state) {
  at::set_num_threads(1);
  const int64_t b = state.range(0), n = state.range(1);
  const at::Tensor levels = torch::tensor(kLevels, torch::kInt64).to(torch::kFloat32);
  const at::Tensor basis = torch::tensor(std::vector<int64_t>{1, 8, 40, 200}, torch::kInt64);
  const at::Tensor x = torch::randn({b, n, 4}, torch::requires_grad());
  const at::Tensor upstream = torch::randn({b, n, 4});
  for (auto _ : state) {
    x.mutable_grad() = at::Tensor();
    const at::Tensor half_l = (levels - 1) * (1 + 1e-3) / 2;
    const at::Tensor offset =
        torch::where(levels.remainder(2) == 0, torch::full_like(levels, 0.5), torch::zeros_like(levels));
    const at::Tensor shift = (offset / half_l).atanh();
    const at::Tensor bounded = (x + shift).tanh() * half_l - offset;
    const at::Tensor codes = (bounded + (bounded.round() - bounded).detach()) / (levels / 2).floor();
    const at::Tensor half_width = (levels / 2).floor();
    const at::Tensor indices = ((codes.detach() * half_width + half_width).round().to(torch::kInt64) * basis).sum(-1);
    codes.backward(upstream);
    benchmark::DoNotOptimize(x.grad().data_ptr<float>());
    benchmark::DoNotOptimize(indices.data_ptr<int64_t>());
  }
  state.counters["tokens"] =
      benchmark::Counter(double(b * n) * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel("1 thread");
}
BENCHMARK(BM_FsqForwardBackwardTorchOps)->Args({16, 1024})->Unit(benchmark::kMicrosecond)->UseRealTime();

// Copy bandwidth in GB/s (read + write bytes) through torch's copy_ on one thread, median of runs.
double measure_copy_gbs(int64_t elements) {
  const at::Tensor src = torch::full({elements}, 1.0f);
  at::Tensor dst = torch::zeros({elements});
  dst.copy_(src);
  std::vector<double> rates;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    dst.copy_(src);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * 4.0 * double(elements) / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// Encode-style forward (no gradient): codes and indices of `elements` floats, levels [8, 5, 5, 5],
// into reused buffers (quantize_and_index_out), beside the copy and triad rates measured in the
// same run. Bytes counted as the triad counts them: z read (4 per element), codes written (4),
// indices written (8 per token of 4 elements); write-allocate traffic is not counted in either.
// At 64K elements everything stays in cache: that case shows the kernel's compute rate.
// arg: elements
void BM_FsqForwardBandwidth(benchmark::State& state) {
  at::set_num_threads(1);
  torch::NoGradGuard no_grad;
  const int64_t elements = state.range(0);
  const double copy_gbs = measure_copy_gbs(elements);
  const double triad_gbs = lockstep::measure_triad_bandwidth_gbs(elements, 0.5);
  Fsq fsq{FsqOptions(kLevels)};
  const at::Tensor z = torch::randn({elements / 4, 4}) * 2;
  at::Tensor codes = torch::empty_like(z), indices = torch::empty({elements / 4}, torch::kInt64);
  fsq.quantize_and_index_out(z, codes, indices);  // warm-up: touches the outputs' pages
  for (auto _ : state) {
    fsq.quantize_and_index_out(z, codes, indices);
    benchmark::DoNotOptimize(codes.data_ptr<float>());
    benchmark::DoNotOptimize(indices.data_ptr<int64_t>());
  }
  const double bytes = double(elements) * (4 + 4) + double(elements / 4) * 8;
  const double gb = bytes * double(state.iterations()) / 1e9;
  state.counters["bytes"] =
      benchmark::Counter(bytes * double(state.iterations()), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["copy_GBps"] = copy_gbs;
  state.counters["triad_GBps"] = triad_gbs;
  // Fractions of the copy and triad rates (rates themselves, so that they divide by the time).
  state.counters["of_copy"] = benchmark::Counter(gb / copy_gbs, benchmark::Counter::kIsRate);
  state.counters["of_triad"] = benchmark::Counter(gb / triad_gbs, benchmark::Counter::kIsRate);
  state.SetLabel("1 thread");
}
// 50M elements (into buffers and allocating) are BM_Quantizer/fsq forward; this one adds the copy rate.
BENCHMARK(BM_FsqForwardBandwidth)->Arg(1 << 16)->Arg(50'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
