// `lockstep bench quantizers`: times each quantizer case of issue #3 and prints it beside the
// machine's limits measured in the same run (sgemm GFLOP/s, triad GB/s) and its peak extra memory.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "lockstep/core/machine.h"
#include "lockstep/core/memory.h"
#include "lockstep/quant/bench_cases.h"

namespace lockstep::cli {
namespace {

struct BenchOptions {
  int threads = 1;
  std::string filter;      // substring of "name shape"
  double min_seconds = 1;  // per case, after one untimed warm-up run
  int min_runs = 3;
};

struct Measured {
  double median_ms = 0;
  double min_ms = 0;
  int runs = 0;
  double extra_mib = 0;  // peak resident memory above the level before the first run
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Measured measure(const quant::BenchCase& c, const BenchOptions& opt) {
  auto run = c.prepare();
  const bool peak_reset = reset_peak_resident();
  const int64_t before = resident_bytes();
  run();  // warm-up: first-touch allocations and caches
  std::vector<double> times;
  const double start = now_ms();
  while (static_cast<int>(times.size()) < opt.min_runs || now_ms() - start < opt.min_seconds * 1000) {
    const double t0 = now_ms();
    run();
    times.push_back(now_ms() - t0);
  }
  Measured m;
  std::sort(times.begin(), times.end());
  m.runs = static_cast<int>(times.size());
  m.median_ms = times[times.size() / 2];
  m.min_ms = times.front();
  m.extra_mib = peak_reset ? std::max<double>(0, peak_resident_bytes() - before) / (1 << 20) : -1;
  return m;
}

std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

// "<= 26 ms", ">= 60% of sgemm", ... or "" when the case has no target.
std::string target_text(const quant::BenchCase& c) {
  std::vector<std::string> parts;
  if (c.target_ms > 0) parts.push_back("<= " + fixed(c.target_ms, c.target_ms < 1 ? 1 : 0) + " ms");
  if (c.target_fraction > 0) parts.push_back(">= " + fixed(c.target_fraction * 100, 0) + "%");
  if (c.target_extra_mib > 0) parts.push_back("<= " + fixed(c.target_extra_mib, 0) + " MiB");
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

bool meets(const quant::BenchCase& c, const Measured& m, double fraction) {
  return (c.target_ms <= 0 || m.median_ms <= c.target_ms) && (c.target_fraction <= 0 || fraction >= c.target_fraction) &&
         (c.target_extra_mib <= 0 || (m.extra_mib >= 0 && m.extra_mib <= c.target_extra_mib));
}

int run_bench(const BenchOptions& opt) {
  at::set_num_threads(opt.threads);
  std::cout << "lockstep bench quantizers: " << opt.threads << (opt.threads == 1 ? " thread" : " threads")
            << "; each case: median of >= " << opt.min_runs << " runs over >= " << fixed(opt.min_seconds, 1)
            << " s after a warm-up\n";
  std::cout.flush();
  const double sgemm = measure_sgemm_gflops(2048, 1.0);
  const double bandwidth = measure_triad_bandwidth_gbs(int64_t{64} << 20, 0.8);
  std::cout << "limits measured now: sgemm n=2048 " << fixed(sgemm, 1) << " GFLOP/s, triad "
            << fixed(bandwidth, 1) << " GB/s\n\n";
  std::cout << std::left << std::setw(13) << "case" << std::setw(31) << "shape" << std::right << std::setw(11)
            << "median ms" << std::setw(13) << "tokens/s" << std::setw(14) << "rate" << std::setw(9) << "limit"
            << std::setw(11) << "extra MiB" << "  target\n";
  int matched = 0;
  for (const auto& c : quant::quantizer_bench_cases()) {
    if (!opt.filter.empty() && (c.name + " " + c.shape).find(opt.filter) == std::string::npos) continue;
    ++matched;
    const Measured m = measure(c, opt);
    const bool flops = c.limit == quant::BenchLimit::Sgemm;
    const double rate = c.work / (m.median_ms * 1e-3) * 1e-9;  // GFLOP/s or GB/s
    const double fraction = rate / (flops ? sgemm : bandwidth);
    const std::string target = target_text(c);
    std::cout << std::left << std::setw(13) << c.name << std::setw(31) << c.shape << std::right << std::setw(11)
              << fixed(m.median_ms, m.median_ms < 10 ? 3 : 1) << std::setw(13) << fixed(c.tokens / (m.median_ms * 1e-3), 0)
              << std::setw(14) << (fixed(rate, 1) + (flops ? " GFLOP/s" : " GB/s")) << std::setw(8)
              << fixed(fraction * 100, 0) << "%" << std::setw(11) << (m.extra_mib < 0 ? "n/a" : fixed(m.extra_mib, 1))
              << "  " << (target.empty() ? "-" : target + (meets(c, m, fraction) ? " (met)" : " (MISSED)")) << "\n";
    std::cout.flush();
  }
  if (matched == 0) {
    std::cerr << "lockstep: error: no benchmark case matches '" << opt.filter << "'\n";
    return kExitUsage;
  }
  std::cout << "\nrate: work per second (flops for GFLOP/s, bytes for GB/s, counted as docs/performance.md says);"
               " limit: rate as a share of the sgemm or triad figure above.\n";
  return kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<BenchOptions>();
  auto* bench = app.add_subcommand("bench", "Benchmarks that print figures beside this machine's measured limits.");
  bench->require_subcommand(1);
  auto* quantizers = bench->add_subcommand(
      "quantizers",
      "Time VQ search, VQ/FSQ/LFQ forward+backward, FSQ over 50M elements and k-means (issue #3's cases): "
      "median time, tokens/s, the share of the sgemm or memory bandwidth measured in the same run, peak "
      "extra memory, and the target for one thread on the reference machine. Takes about a minute.");
  quantizers->add_option("--threads", opt->threads, "Intra-op threads (the targets are for 1)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  quantizers->add_option("--filter", opt->filter, "Run only cases whose 'name shape' contains this text");
  quantizers->add_option("--min-time", opt->min_seconds, "Seconds to repeat each case for")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  quantizers->callback([&run, opt] { run = [opt] { return run_bench(*opt); }; });
}

}  // namespace lockstep::cli
