// The subcommands of the `lockstep` tool. Each registers its options on `app` and, when chosen,
// the function that runs it; the function returns the process exit status and may throw
// lockstep::Error, which main() reports.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace lockstep::cli {

using Runner = std::function<int()>;

void add_train_command(CLI::App& app, Runner& run);
void add_eval_command(CLI::App& app, Runner& run);
void add_encode_command(CLI::App& app, Runner& run);
void add_decode_command(CLI::App& app, Runner& run);
void add_doctor_command(CLI::App& app, Runner& run);
void add_bench_command(CLI::App& app, Runner& run);
void add_launch_command(CLI::App& app, Runner& run);

// Exit statuses shared by every subcommand.
constexpr int kExitOk = 0;
constexpr int kExitError = 1;  // a lockstep::Error: bad input, missing file, failed run
constexpr int kExitUsage = 2;  // bad command line

}  // namespace lockstep::cli
