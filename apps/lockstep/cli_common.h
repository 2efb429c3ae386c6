// Small pieces several subcommands share.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "lockstep/core/threads.h"
#include "lockstep/model/autoencoder.h"
#include "lockstep/train/evaluate.h"

namespace lockstep::cli {

// Validators whose messages say the rule and the value (CLI11's PositiveNumber prints DBL_MAX in
// 309 digits, and an integer option silently clamps 99999999999999999999).
extern const CLI::Validator kPositiveInt;      // a whole number >= 1 that fits in 64 bits
extern const CLI::Validator kNonNegativeInt;   // a whole number >= 0 that fits in 64 bits
extern const CLI::Validator kPositiveReal;     // a finite number > 0
extern const CLI::Validator kNonNegativeReal;  // a finite number >= 0
extern const CLI::Validator kNonEmptyPath;     // a path, not "" (which would silently mean a default)

constexpr const char* kThreadsHelp =
    "Intra-op threads (0 = OMP_NUM_THREADS when set, else the cores shared among the ranks on this node)";

// Adds --threads; apply_threads() then sets torch's intra-op thread count (see choose_threads).
void add_threads_option(CLI::App& cmd, int& threads);
// --ema: use the moving average of the weights that a run with train.ema_decay > 0 keeps.
void add_weight_average_option(CLI::App& cmd, bool& weight_average);
ThreadChoice apply_threads(int threads);

bool stdout_is_terminal();

// lockstep launch starts rank 0 first, with MASTER_PORT=0 and this variable naming the write end
// of a pipe: rank 0's store listens on a port the kernel chose, rank 0 writes it there, and launch
// then starts the other ranks with it. No port is ever guessed, so runs side by side cannot collide.
constexpr const char* kStorePortFdEnv = "LOCKSTEP_STORE_PORT_FD";
// How many times launch started the ranks again after a lost one (torchrun's own is
// TORCHELASTIC_RESTART_COUNT); train resumes its --run-dir when either is above 0.
constexpr const char* kRestartCountEnv = "LOCKSTEP_RESTART_COUNT";
// Writes "<port>\n" to the pipe kStorePortFdEnv names, if it is set, and closes it.
void announce_store_port(int port);

// `v` with `digits` decimals: fixed(3.14159, 2) == "3.14".
std::string fixed(double v, int digits);

// "mse 0.00612  psnr 22.13 dB  codes used 812/1000 (81.2%)  perplexity 530.2"
std::string format_eval(const train::EvalResult& r);

// Prints "lockstep: error: <message>" to stderr and, when TORCHELASTIC_ERROR_FILE is set (torchrun
// sets it per rank), writes the error there as JSON in the format torchrun reads back and shows.
void report_error(const std::string& message);

// Throws InvalidArgument, with the figures, before a forward pass (encode, decode) of `images`
// images of width x height that cannot fit in the memory available (--batch-size sets `images`).
void check_forward_fits(const model::AutoencoderImpl& model, int64_t images, int64_t width, int64_t height);

// Reports the exception being handled (LibTorch's without its C++ stack frames) and returns the
// exit status of its class (commands.h). Call from inside a catch block.
int report_current_exception();

}  // namespace lockstep::cli
