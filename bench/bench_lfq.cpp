// LFQ's entropy loss as the reference computes it, with the full (n, K) softmax, on 16 x 1024 tokens
// and one thread: the baseline for lockstep's factorised LFQ, whose own figures are the table's
// (bench_quantizers.cpp, BM_Quantizer/lfq ...). Only where it fits in memory (not K = 2^16: 4 GiB a
// matrix).
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "lockstep/core/machine.h"
#include "lockstep/core/memory.h"
#include "lockstep/quant/lfq.h"

namespace {

// Peak resident bytes above the resident size at the start of `step` (core/memory.h), or -1.
template <typename Step>
double peak_extra_bytes(Step step) {
  if (!lockstep::reset_peak_resident()) return -1;
  const int64_t before = lockstep::resident_bytes();
  step();
  // The kernel's RSS counters lag by a few pages: a tiny negative difference means no growth.
  return static_cast<double>(std::max<int64_t>(0, lockstep::peak_resident_bytes() - before));
}

at::Tensor brute_entropy_loss(const at::Tensor& x, const at::Tensor& codebook, double inv_t) {
  const at::Tensor p = (torch::matmul(x, codebook.t()) * (2 * inv_t)).softmax(-1);
  const at::Tensor per_sample = -(p * p.clamp_min(1e-5).log()).sum(-1).mean();
  const at::Tensor avg = p.mean(0);
  return (per_sample + (avg * avg.clamp_min(1e-5).log()).sum()) * 0.1;
}

void BM_LfqBruteForceTrainStep(benchmark::State& state) {
  at::set_num_threads(1);
  const int64_t bits = state.range(0);
  torch::manual_seed(0);
  lockstep::quant::Lfq lfq(lockstep::quant::LfqOptions(int64_t{1} << bits));
  const at::Tensor codebook = lfq.indices_to_codes(torch::arange(int64_t{1} << bits));
  const at::Tensor x = (torch::randn({16, 1024, bits}) * 0.01).requires_grad_();
  const auto step = [&] {
    const at::Tensor loss = brute_entropy_loss(x.reshape({-1, bits}), codebook, 100.0);
    loss.backward();
    x.mutable_grad().reset();
  };
  step();  // warm-up
  const double extra = peak_extra_bytes(step);
  for (auto _ : state) step();
  state.counters["tokens/s"] =
      benchmark::Counter(16.0 * 1024 * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["peak_extra_MiB"] = extra < 0 ? -1.0 : extra / (1 << 20);
  const auto blas = lockstep::detect_blas();
  state.SetLabel("brute (n, K) softmax, " + blas.vendor + ", 1 thread");
}
BENCHMARK(BM_LfqBruteForceTrainStep)->ArgNames({"bits"})->Args({10})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
