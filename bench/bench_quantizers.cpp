// The quantizer benchmark cases (bench/cases/quantizer_cases.cpp), the same ones `lockstep bench quantizers`
// prints, as Google Benchmarks on one thread with a work-rate counter.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include "quantizer_cases.h"

namespace {

const bool registered = [] {
  for (const auto& c : lockstep::bench::quantizer_bench_cases()) {
    benchmark::RegisterBenchmark(("BM_Quantizer/" + c.name + "/" + c.shape).c_str(),
                                 [c](benchmark::State& state) {
                                   at::set_num_threads(1);
                                   auto run = c.prepare();
                                   for (auto _ : state) run();
                                   const bool flops = c.limit == lockstep::bench::BenchLimit::Sgemm;
                                   state.counters[flops ? "GFLOP" : "GB"] = benchmark::Counter(
                                       c.work * 1e-9 * double(state.iterations()), benchmark::Counter::kIsRate);
                                   state.counters["tokens"] = benchmark::Counter(c.tokens * double(state.iterations()),
                                                                                 benchmark::Counter::kIsRate);
                                 })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  return true;
}();

}  // namespace
