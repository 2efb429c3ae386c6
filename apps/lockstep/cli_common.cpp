#include "cli_common.h"

#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

namespace lockstep::cli {

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("--threads", threads, "Intra-op threads (0 = one per core)")->check(CLI::NonNegativeNumber);
}

void apply_threads(int threads) {
  at::set_num_threads(threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

bool stdout_is_terminal() { return isatty(fileno(stdout)) != 0; }

std::string format_eval(const train::EvalResult& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "mse %.5f  psnr %.2f dB  codes used %lld/%lld (%.1f%%)  perplexity %.1f", r.mse,
                r.psnr_db, static_cast<long long>(r.codes_used), static_cast<long long>(r.codebook_size),
                100.0 * r.code_usage, r.perplexity);
  return buf;
}

}  // namespace lockstep::cli
