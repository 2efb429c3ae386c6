// Small pieces several subcommands share.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "lockstep/train/evaluate.h"

namespace lockstep::cli {

// Adds --threads; apply_threads() then sets torch's intra-op thread count (0 = all cores).
void add_threads_option(CLI::App& cmd, int& threads);
void apply_threads(int threads);

bool stdout_is_terminal();

// `v` with `digits` decimals: fixed(3.14159, 2) == "3.14".
std::string fixed(double v, int digits);

// "mse 0.00612  psnr 22.13 dB  codes used 812/1000 (81.2%)  perplexity 530.2"
std::string format_eval(const train::EvalResult& r);

// Prints "lockstep: error: <message>" to stderr and, when TORCHELASTIC_ERROR_FILE is set (torchrun
// sets it per rank), writes the error there as JSON in the format torchrun reads back and shows.
void report_error(const std::string& message);

}  // namespace lockstep::cli
