// `lockstep bench quantizers`: times each quantizer case and prints it beside the
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
#include <thread>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "lockstep/config_build.h"
#include "lockstep/core/machine.h"
#include "lockstep/core/memory.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/train/device.h"
#include "quantizer_cases.h"

namespace lockstep::cli {
namespace {

struct BenchOptions {
  int threads = 1;
  std::string filter;      // substring of "name shape"
  double min_seconds = 1;  // per case, after one untimed warm-up run
  int min_runs = 3;
  std::string device = "cpu";  // or cuda, cuda:N
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

Measured measure(const bench::BenchCase& c, const BenchOptions& opt) {
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

// "<= 26 ms", ">= 60% of sgemm", ... or "" when the case has no target.
std::string target_text(const bench::BenchCase& c) {
  std::vector<std::string> parts;
  if (c.target_ms > 0) parts.push_back("<= " + fixed(c.target_ms, c.target_ms < 1 ? 1 : 0) + " ms");
  if (c.target_fraction > 0) parts.push_back(">= " + fixed(c.target_fraction * 100, 0) + "%");
  if (c.target_extra_mib > 0) parts.push_back("<= " + fixed(c.target_extra_mib, 0) + " MiB");
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

bool meets(const bench::BenchCase& c, const Measured& m, double fraction) {
  return (c.target_ms <= 0 || m.median_ms <= c.target_ms) &&
         (c.target_fraction <= 0 || fraction >= c.target_fraction) &&
         (c.target_extra_mib <= 0 || (m.extra_mib >= 0 && m.extra_mib <= c.target_extra_mib));
}

int run_bench(const BenchOptions& opt) {
  // A device that is no device is a bad command line (exit status 2); one this build cannot use is not.
  const auto spec = [&] {
    try {
      return train::parse_device_spec(opt.device, "--device");
    } catch (const InvalidArgument& e) {
      throw UsageError(e.what());
    }
  }();
  const int cuda = train::cuda_index_for(spec, "--device");
  const bool on_gpu = cuda >= 0;
  std::vector<bench::BenchCase> cases;
  for (auto& c : bench::quantizer_bench_cases(cuda)) {
    if (opt.filter.empty() || (c.name + " " + c.shape).find(opt.filter) != std::string::npos) cases.push_back(c);
  }
  if (cases.empty()) {
    std::cerr << "lockstep: error: no benchmark case matches '" << opt.filter << "'\n";
    return kExitUsage;
  }
  at::set_num_threads(opt.threads);
  std::cout << "lockstep bench quantizers: "
            << (on_gpu ? "cuda:" + std::to_string(cuda) +
                             (LOCKSTEP_HAVE_CUDA_KERNELS ? " (CUDA kernels where lockstep has them)"
                                                         : " (the device-independent paths: no CUDA kernels built)")
                       : std::to_string(opt.threads) + (opt.threads == 1 ? " thread" : " threads"))
            << "; each case: median of >= " << opt.min_runs << " runs over >= " << fixed(opt.min_seconds, 1)
            << " s after a warm-up\n";
  std::cout.flush();
  const int64_t sgemm_n = on_gpu ? 8192 : 2048;
  const double sgemm = measure_sgemm_gflops(sgemm_n, 1.0, cuda);
  const double bandwidth = measure_triad_bandwidth_gbs(int64_t{on_gpu ? 256 : 64} << 20, 0.8, cuda);
  std::cout << "limits measured now" << (on_gpu ? " on the device" : "") << ": sgemm n=" << sgemm_n << " "
            << fixed(sgemm, 1) << " GFLOP/s, triad " << fixed(bandwidth, 1) << " GB/s\n\n";
  std::cout << std::left << std::setw(13) << "case" << std::setw(31) << "shape" << std::right << std::setw(11)
            << "median ms" << std::setw(13) << "tokens/s" << std::setw(17) << "rate" << std::setw(9) << "limit"
            << std::setw(11) << "extra MiB"
            << "  target\n";
  for (const auto& c : cases) {
    const Measured m = measure(c, opt);
    const bool flops = c.limit == bench::BenchLimit::Sgemm;
    const double rate = c.work / (m.median_ms * 1e-3) * 1e-9;  // GFLOP/s or GB/s
    const double fraction = rate / (flops ? sgemm : bandwidth);
    // The targets are for one thread of the reference CPU; host memory says nothing about a GPU run.
    const std::string target = on_gpu ? "" : target_text(c);
    const double extra_mib = on_gpu ? -1 : m.extra_mib;
    std::cout << std::left << std::setw(13) << c.name << std::setw(31) << c.shape << std::right << std::setw(11)
              << fixed(m.median_ms, m.median_ms < 10 ? 3 : 1) << std::setw(13)
              << fixed(c.tokens / (m.median_ms * 1e-3), 0) << std::setw(17)  // room for "123456.7 GFLOP/s"
              << (fixed(rate, 1) + (flops ? " GFLOP/s" : " GB/s")) << std::setw(8) << fixed(fraction * 100, 0) << "%"
              << std::setw(11) << (extra_mib < 0 ? "n/a" : fixed(extra_mib, 1)) << "  "
              << (target.empty() ? "-" : target + (meets(c, m, fraction) ? " (met)" : " (MISSED)")) << "\n";
    std::cout.flush();
  }
  std::cout << "\nrate: work per second (flops for GFLOP/s, bytes for GB/s, counted as docs/performance.md says);"
               " limit: rate as a share of the sgemm or triad figure above.\n";
  return kExitOk;
}

struct CollectiveBenchOptions {
  int ranks = 2;
  int iterations = 2000;
  int port = 29531;
};

// How the channel checks each call: not at all, by an exchange of fingerprints, or (the default) by an
// exchange until the calls repeat, then locally against the repetition (docs/distributed.md).
enum class Checking { None, Exchange, Predicted };

// Microseconds per call of `op` on every rank of a group of `ranks` threads on 127.0.0.1.
double time_collective(const CollectiveBenchOptions& opt, Checking checking, int port,
                       const std::function<void(dist::Group&)>& op) {
  std::vector<double> per_rank(opt.ranks);
  std::vector<std::shared_ptr<dist::Group>> groups(opt.ranks);
  std::vector<std::exception_ptr> errors(opt.ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < opt.ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::GroupOptions o;
        o.rank = r;
        o.size = opt.ranks;
        o.master_port = port;
        o.checked = checking != Checking::None;
        o.predict = checking == Checking::Predicted;
        groups[r] = dist::make_process_group(o);
        for (int i = 0; i < opt.iterations / 10; ++i) op(*groups[r]);  // warm-up
        groups[r]->barrier(LOCKSTEP_CALL_SITE("bench.start"));
        const double t0 = now_ms();
        for (int i = 0; i < opt.iterations; ++i) op(*groups[r]);
        per_rank[r] = (now_ms() - t0) * 1000 / opt.iterations;
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return *std::max_element(per_rank.begin(), per_rank.end());
}

int run_collective_bench(const CollectiveBenchOptions& opt) {
  at::set_num_threads(1);
  std::cout << "lockstep bench collectives: " << opt.ranks << " ranks as threads of this process on 127.0.0.1 "
            << "(Gloo), " << opt.iterations << " calls each; microseconds per call, slowest rank\n\n";
  std::cout << std::left << std::setw(34) << "collective" << std::right << std::setw(12) << "unchecked" << std::setw(12)
            << "exchanged" << std::setw(12) << "overhead" << std::setw(12) << "predicted" << std::setw(12) << "overhead"
            << "\n";
  struct Case {
    std::string name;
    std::function<void(dist::Group&)> op;
  };
  const std::vector<Case> cases = {
      {"barrier", [](dist::Group& g) { g.barrier(LOCKSTEP_CALL_SITE("bench.barrier")); }},
      {"all_reduce 2 tensors, 8 floats",
       [](dist::Group& g) {
         std::vector<at::Tensor> t{torch::ones({4}), torch::ones({4})};
         g.all_reduce(t, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("bench.small"));
       }},
      {"all_reduce 1M floats (4 MB)",
       [](dist::Group& g) {
         static thread_local at::Tensor big = torch::ones({1 << 20});
         std::vector<at::Tensor> t{big};
         g.all_reduce(t, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("bench.big"));
       }},
  };
  int port = opt.port;
  for (const auto& c : cases) {
    CollectiveBenchOptions o = opt;
    if (c.name.find("1M") != std::string::npos) o.iterations = std::max(10, opt.iterations / 50);
    const double plain = time_collective(o, Checking::None, port++, c.op);
    const double exchanged = time_collective(o, Checking::Exchange, port++, c.op);
    const double predicted = time_collective(o, Checking::Predicted, port++, c.op);
    std::cout << std::left << std::setw(34) << c.name << std::right << std::setw(12) << fixed(plain, 1) << std::setw(12)
              << fixed(exchanged, 1) << std::setw(12) << fixed(exchanged - plain, 1) << std::setw(12)
              << fixed(predicted, 1) << std::setw(12) << fixed(predicted - plain, 1) << "\n";
    std::cout.flush();
  }
  std::cout << "\nexchanged: every call first exchanges a fixed-size fingerprint (G1; GroupOptions::predict = false); "
               "predicted (the default): once the calls repeat, each is checked against the repetition on its own "
               "rank, with no exchange; unchecked: neither (GroupOptions::checked = false, for this measurement "
               "only).\n";
  return kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& app, Runner& run) {
  auto opt = std::make_shared<BenchOptions>();
  auto* bench = app.add_subcommand("bench", "Benchmarks that print figures beside this machine's measured limits.");
  bench->require_subcommand(1);
  auto* quantizers = bench->add_subcommand(
      "quantizers",
      "Time VQ search, VQ/FSQ/LFQ forward+backward, FSQ over 50M elements and k-means (the cases of "
      "docs/performance.md): "
      "median time, tokens/s, the share of the sgemm or memory bandwidth measured in the same run, peak "
      "extra memory, and the target for one thread on the reference machine. Takes about a minute.");
  quantizers->add_option("--threads", opt->threads, "Intra-op threads (the targets are for 1)")
      ->capture_default_str()
      ->check(kPositiveInt);
  quantizers->add_option("--filter", opt->filter, "Run only cases whose 'name shape' contains this text");
  quantizers->add_option("--min-time", opt->min_seconds, "Seconds to repeat each case for")
      ->capture_default_str()
      ->check(kPositiveReal);
  quantizers
      ->add_option("--device", opt->device,
                   "cpu, or cuda / cuda:N: the same cases on a GPU (lockstep's CUDA kernels where built, else "
                   "the device-independent paths) and a few of the GPU's own, limits measured on the device, no "
                   "CPU targets")
      ->capture_default_str();
  quantizers->callback([&run, opt] { run = [opt] { return run_bench(*opt); }; });
  auto copt = std::make_shared<CollectiveBenchOptions>();
  auto* collectives = bench->add_subcommand(
      "collectives",
      "Time barrier and all_reduce (small and 4 MB) on a Gloo group of ranks run as threads on 127.0.0.1, "
      "unchecked, checked by an exchange of fingerprints, and checked on the prediction (the default): what "
      "checking every collective costs.");
  // Up to 64: how the check's cost grows with the number of ranks (docs/distributed.md); each rank holds
  // a TCP connection to every other, so 64 ranks need about 4,200 open files (ulimit -n).
  collectives->add_option("--ranks", copt->ranks, "Ranks (threads)")->capture_default_str()->check(CLI::Range(2, 64));
  collectives->add_option("--iterations", copt->iterations, "Calls per small case")
      ->capture_default_str()
      ->check(CLI::Range(10, 1000000));
  collectives->add_option("--port", copt->port, "First of the 9 consecutive ports to use on 127.0.0.1")
      ->capture_default_str()
      ->check(CLI::Range(1024, 65000));
  collectives->callback([&run, copt] { run = [copt] { return run_collective_bench(*copt); }; });
}

}  // namespace lockstep::cli
