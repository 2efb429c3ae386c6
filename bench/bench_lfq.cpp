// LFQ training step (forward + backward of Lfq::quantize's losses) on 16 x 1024 tokens, one
// thread: time, tokens/s, and the peak resident memory above the starting point during one step
// (Linux VmHWM, reset through /proc/self/clear_refs). "brute" is the reference's formulation with
// the full (n, K) softmax, for comparison where it fits in memory (not at K = 2^16: 4 GiB a matrix).
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <string>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "lockstep/core/machine.h"
#include "lockstep/quant/lfq.h"

namespace {

// A field of /proc/self/status in KiB (VmRSS, VmHWM); -1 when unavailable.
int64_t status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// Peak resident bytes above the resident size at the start of `step`, or -1 when not measurable.
template <typename Step>
double peak_extra_bytes(Step step) {
#if defined(__GLIBC__)
  // Hand freed heap memory back first: otherwise the step reuses pages the warm-up left resident
  // (glibc raises its mmap threshold after big frees) and its peak is invisible in VmHWM.
  malloc_trim(0);
#endif
  { std::ofstream("/proc/self/clear_refs") << "5"; }  // resets VmHWM to the current VmRSS
  const int64_t before = status_kib("VmRSS");
  step();
  const int64_t peak = status_kib("VmHWM");
  // The kernel's RSS counters lag by a few pages: a tiny negative difference means no growth.
  return before < 0 || peak < 0 ? -1.0 : double(std::max<int64_t>(0, peak - before)) * 1024.0;
}

at::Tensor brute_entropy_loss(const at::Tensor& x, const at::Tensor& codebook, double inv_t) {
  const at::Tensor p = (torch::matmul(x, codebook.t()) * (2 * inv_t)).softmax(-1);
  const at::Tensor per_sample = -(p * p.clamp_min(1e-5).log()).sum(-1).mean();
  const at::Tensor avg = p.mean(0);
  return (per_sample + (avg * avg.clamp_min(1e-5).log()).sum()) * 0.1;
}

void BM_LfqTrainStep(benchmark::State& state) {
  at::set_num_threads(1);
  const int64_t bits = state.range(0);
  const bool brute = state.range(1) != 0;
  torch::manual_seed(0);
  lockstep::quant::Lfq lfq(lockstep::quant::LfqOptions(int64_t{1} << bits));
  const at::Tensor codebook = lfq.indices_to_codes(torch::arange(int64_t{1} << bits));
  const at::Tensor x = (torch::randn({16, 1024, bits}) * 0.01).requires_grad_();
  const auto step = [&] {
    const at::Tensor loss = brute ? brute_entropy_loss(x.reshape({-1, bits}), codebook, 100.0)
                                  : lfq.quantize(x, {}).total_loss();
    loss.backward();
    x.mutable_grad().reset();
  };
  step();  // warm-up
  const double extra = peak_extra_bytes(step);
  for (auto _ : state) step();
  state.counters["tokens/s"] = benchmark::Counter(16.0 * 1024 * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["peak_extra_MiB"] = extra < 0 ? -1.0 : extra / (1 << 20);
  const auto blas = lockstep::detect_blas();
  state.SetLabel(std::string(brute ? "brute (n, K) softmax" : "factorised hi/lo GEMM") + ", " + blas.vendor + ", 1 thread");
}
BENCHMARK(BM_LfqTrainStep)
    ->ArgNames({"bits", "brute"})
    ->Args({10, 0})
    ->Args({10, 1})
    ->Args({16, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
