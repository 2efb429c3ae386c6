#include "cli_common.h"

#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
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

std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

void report_error(const std::string& message) {
  std::cerr << "lockstep: error: " << message << "\n";
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  nlohmann::json error;
  error["message"]["message"] = "lockstep: " + message;
  error["message"]["extraInfo"]["py_callstack"] = "(a C++ program: no Python stack)";
  error["message"]["extraInfo"]["timestamp"] = std::to_string(std::time(nullptr));
  std::ofstream out(path);
  out << error.dump() << "\n";
  if (!out) std::cerr << "lockstep: could not write the error to TORCHELASTIC_ERROR_FILE=" << path << "\n";
}

}  // namespace lockstep::cli
