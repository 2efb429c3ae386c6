// The subcommands of the `lockstep` tool. Each registers its options on `app` and, when chosen,
// the function that runs it; the function returns the process exit status and may throw
// lockstep::Error, which main() reports.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include "lockstep/core/error.h"

namespace lockstep::cli {

// A mistake decided from the command line alone (flags that contradict each other, a value out of
// its flag's range): reported as any InvalidArgument, with exit status 2 (kExitUsage).
class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};
#define LOCKSTEP_CHECK_USAGE(cond, ...) LOCKSTEP_THROW_IF_NOT(cond, ::lockstep::cli::UsageError, __VA_ARGS__)

using Runner = std::function<int()>;

void add_train_command(CLI::App& app, Runner& run);
void add_eval_command(CLI::App& app, Runner& run);
void add_encode_command(CLI::App& app, Runner& run);
void add_decode_command(CLI::App& app, Runner& run);
void add_doctor_command(CLI::App& app, Runner& run);
void add_bench_command(CLI::App& app, Runner& run);
void add_launch_command(CLI::App& app, Runner& run);

// Exit statuses shared by every subcommand.
// Exit statuses, by what the user can do about the failure (README, "Exit status").
constexpr int kExitOk = 0;
constexpr int kExitError = 1;     // bad input or environment: configuration, data, files (fix and rerun)
constexpr int kExitUsage = 2;     // bad command line
constexpr int kExitRankLost = 3;  // a rank died or stalled, or ranks could not meet (resume may succeed)
constexpr int kExitRanksDiffer =
    4;                            // ranks disagreed about a collective, the model or the data (resuming will not help)
constexpr int kExitDiverged = 5;  // the loss became nan or infinite (the last checkpoint is from before)
constexpr int kExitInterrupted = 130;  // Ctrl-C or SIGTERM: checkpoint saved, resume continues
constexpr int kExitInternal = 70;      // a bug in lockstep (EX_SOFTWARE)

}  // namespace lockstep::cli
