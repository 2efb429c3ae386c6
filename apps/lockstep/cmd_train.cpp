// lockstep train: train an autoencoder into a run directory, or resume one.
#include <c10/util/Exception.h>

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <tuple>

#include "cli_common.h"
#include "commands.h"
#include "lockstep/core/error.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/group.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/train/device.h"
#include "lockstep/train/resolve_run.h"
#include "lockstep/train/run_dir.h"
#include "lockstep/train/trainer.h"
#include "progress.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

struct TrainArgs {
  std::string config_file;
  std::vector<std::string> sets;
  std::string run_dir;
  std::string resume;
  bool print_config = false;
  double collective_timeout_s = 300;
  // Explicit ranks (instead of torchrun's environment); -1 / empty: not given.
  int rank = -1;
  int world_size = -1;
  std::string master_addr;
  int master_port = -1;
  // Shortcuts for common keys; each becomes a --set.
  struct Shortcut {
    std::string flag, key, value;
  };
  std::vector<Shortcut> shortcuts;
};

std::atomic<bool> g_stop{false};
// One Ctrl-C can arrive twice, within milliseconds: from the terminal and forwarded by a launcher
// (lockstep launch's ranks share its process group; torchrun follows with SIGTERM), so a second
// signal counts only 0.25 s after the first.
std::atomic<int64_t> g_first_interrupt_ns{0};
int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}
// The first Ctrl-C (or SIGTERM) asks the run to stop after the step under way; a second one ends the
// process at once (async-signal-safe calls only). Checkpoints are written atomically, so the last
// one stays valid either way.
extern "C" void on_interrupt(int sig) {
  if (!g_stop.exchange(true)) {
    g_first_interrupt_ns.store(monotonic_ns());
    // Said to a person's Ctrl-C only: a launcher's SIGTERM is answered by the stop itself.
    static const char first[] = "\nlockstep: stopping after the step under way (interrupt again to stop at once)\n";
    if (sig == SIGINT) {
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, first, sizeof first - 1);
    }
    return;
  }
  if (sig != SIGINT && sig != SIGTERM) return;  // a hang-up is not repeated by a person in a hurry
  if (monotonic_ns() - g_first_interrupt_ns.load() < 250000000) return;
  static const char second[] = "\nlockstep: stopped at once (a second interrupt); the last checkpoint is intact\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, second, sizeof second - 1);
  ::_exit(kExitInterrupted);
}

// A closed stdout (`train | head`, a killed launcher's pipe) stops the run after its step, as SIGTERM does,
// instead of ending it unsaved; later writes then fail quietly (EPIPE) instead of raising SIGPIPE again.
extern "C" void on_broken_pipe(int) {
  ::signal(SIGPIPE, SIG_IGN);
  if (!g_stop.exchange(true)) g_first_interrupt_ns.store(monotonic_ns());
}

// The lines that close a run go to stdout, or to stderr once stdout is closed.
void say(const std::string& text) {
  std::cout << text << std::flush;
  if (!std::cout) std::cerr << text << std::flush;
}

std::string ranks_text(const std::vector<int>& ranks) {  // "0, 2"
  std::vector<std::string> names;
  for (int r : ranks) names.push_back(std::to_string(r));
  return detail::concat_list(names);
}

std::string default_run_dir() {
  char buf[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "runs/%Y%m%d-%H%M%S", std::localtime(&now));
  return buf;
}

void add_shortcut(CLI::App& cmd, TrainArgs& args, const std::string& flag, const std::string& type,
                  const std::string& key, const std::string& help) {
  cmd.add_option_function<std::string>(
         flag,
         [&args, flag, key](const std::string& v) {
           args.shortcuts.push_back({flag, key, v});
         },
         help + " (same as --set " + key + "=...)")
      ->type_name(type);
}

std::vector<std::string> overrides(const TrainArgs& args) {
  std::vector<std::string> all;
  for (const auto& shortcut : args.shortcuts) all.push_back(shortcut.key + "=" + shortcut.value);
  all.insert(all.end(), args.sets.begin(), args.sets.end());
  return all;
}

int run_train_on(const TrainArgs& args, train::ResolvedRun run, std::shared_ptr<dist::Group> group);

// Each flag that sets a key, and each --set, checked alone before anything is read: a value its key
// refuses (a type, a range, an unknown key) is a bad command line (exit status 2), named by its flag.
// What depends on other keys or on the files is checked when the run is resolved (exit status 1).
void check_flag_values(const TrainArgs& args) {
  const auto check = [](const std::string& given, const std::string& assignment) {
    train::Config probe(train::lockstep_schema());
    try {
      probe.set_from_string(assignment);
    } catch (const InvalidArgument& e) {
      throw UsageError(given + ": " + e.what());
    }
  };
  for (const auto& shortcut : args.shortcuts) {
    check(shortcut.flag + " " + shortcut.value, shortcut.key + "=" + shortcut.value);
  }
  for (const auto& assignment : args.sets) check("--set " + assignment, assignment);
}

// A new run's configuration: the defaults, then --config's file, then the overrides in order.
train::ResolvedRun new_run(const TrainArgs& args) { return train::resolve_new_run(args.config_file, overrides(args)); }

// The run's configuration and settings, resolved once, before the process group exists: its
// train.device says where NCCL is set up. A resumed run's: its directory's config.toml and the overrides.
train::ResolvedRun resolve_run(const TrainArgs& args) {
  return args.resume.empty() ? new_run(args) : train::resolve_resumed_run(args.resume, overrides(args));
}

// How many times a launcher started this rank again after a lost one: 0 on the first start.
int restart_count() {
  for (const char* name : {kRestartCountEnv, "TORCHELASTIC_RESTART_COUNT"}) {
    const char* value = std::getenv(name);
    if (value && std::atoi(value) > 0) return std::atoi(value);
  }
  return 0;
}

int run_train(TrainArgs args) {
  // Started again after a lost rank (launch --max-restarts, torchrun --max-restarts) with the command
  // that started the run: its --run-dir, once it holds the run, is resumed from its last checkpoint.
  // --config's file and the flags that set keys are already in its config.toml (given again, a key a
  // resumed run may not change would be refused even at the same value).
  if (const int restart = restart_count();
      restart > 0 && args.resume.empty() && !args.run_dir.empty() && fs::exists(train::config_path(args.run_dir))) {
    std::cout << "restart " << restart << ": resuming " << args.run_dir << " from its last checkpoint" << std::endl;
    args.resume = args.run_dir;
    args.run_dir.clear();
    args.config_file.clear();
    args.sets.clear();
    args.shortcuts.clear();
  }
  // Flags that contradict each other or values their keys refuse, before anything is read (exit status 2).
  check_flag_values(args);
  if (!args.resume.empty()) {
    LOCKSTEP_CHECK_USAGE(!args.print_config, "--print-config shows a new run's configuration; a run being resumed ",
                         "keeps its own in ", args.resume, "/config.toml");
    LOCKSTEP_CHECK_USAGE(args.config_file.empty() && args.run_dir.empty(),
                         "--resume continues a run with its own config and directory; do not combine it with ",
                         "--config or --run-dir");
  }
  train::ResolvedRun run = resolve_run(args);
  if (args.print_config) {  // a new run's (refused with --resume above)
    std::cout << run.config.to_toml();
    return kExitOk;
  }
  // Started as one rank of several (lockstep launch, torchrun): join the others.
  std::shared_ptr<dist::Group> group;
  const bool flags_give_ranks = args.world_size > 0 || args.rank >= 0;
  if (flags_give_ranks || dist::GroupOptions::environment_has_ranks()) {
    // Flags override the environment, key by key; but a launcher's ranks all got its WORLD_SIZE and
    // their own RANK, so a flag that says otherwise would leave ranks waiting for each other.
    for (const auto& [flag, given, name] :
         {std::tuple{"--world-size", args.world_size, "WORLD_SIZE"}, std::tuple{"--rank", args.rank, "RANK"}}) {
      const char* set = std::getenv(name);
      LOCKSTEP_CHECK_USAGE(given < 0 || !set || std::to_string(given) == set, flag, " ", given, " contradicts ", name,
                           "=", set ? set : "",
                           " set by the launcher (lockstep launch or torchrun); give one or the other");
    }
    dist::GroupOptions options = dist::GroupOptions::from_environment();
    if (args.world_size > 0) options.size = args.world_size;
    if (args.rank >= 0) options.rank = args.rank;
    if (!args.master_addr.empty()) options.master_addr = args.master_addr;
    if (args.master_port >= 0) options.master_port = args.master_port;
    const bool any_port = options.master_port == 0;
    options.on_listening = [any_port, addr = options.master_addr](int port) {
      // Someone must tell the other ranks a port the kernel chose: launch (through the pipe) or the user.
      if (any_port) std::cout << "rank 0: the store listens on " << addr << ":" << port << std::endl;
      announce_store_port(port);
    };
    LOCKSTEP_CHECK_USAGE(options.rank < options.size, "--rank ", options.rank, " must be below --world-size ",
                         options.size);
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(args.collective_timeout_s * 1000));
    options.cuda_device = train::cuda_device_index(run.settings);
    group = dist::make_process_group(options);
  } else {
    group = dist::make_single_process_group();
  }
  // Reported here, while the group still exists: after a failure rank 0 keeps its store up for a
  // moment on destruction so that the other ranks can read where everyone was.
  try {
    return run_train_on(args, std::move(run), group);
  } catch (const dist::CollectiveFailure& e) {
    // Asked to stop (launch stops the others when one rank fails) while in a collective that the
    // stop, or the failed rank, broke: one line; the rank that failed first reports the cause.
    if (!g_stop.load()) return report_current_exception();
    const auto* lost = dynamic_cast<const dist::PeerLost*>(&e);
    std::cerr << "lockstep: rank " << group->rank() << " of " << group->size() << " stopped on request (a signal)"
              << (lost && !lost->ranks().empty() ? " after rank(s) " + ranks_text(lost->ranks()) + " failed" : "")
              << "; the first rank to fail reports the cause" << std::endl;
    return kExitRankLost;
  } catch (const std::exception&) {
    return report_current_exception();
  }
}

int run_train_on(const TrainArgs& args, train::ResolvedRun run, std::shared_ptr<dist::Group> group) {
  // Before the first step (scanning an image folder, what the data is): plain lines.
  const auto print_line = [](const std::string& text) { std::cout << text << std::endl; };
  std::unique_ptr<train::Trainer> trainer;
  const bool root = group->rank() == 0;
  if (!args.resume.empty()) {
    trainer = train::Trainer::resume(args.resume, std::move(run), !overrides(args).empty(), group, print_line);
  } else if (!args.run_dir.empty()) {
    trainer = train::Trainer::create(std::move(run), args.run_dir, group, print_line);
  } else {
    // A run that fails before it starts leaves no runs/<date-time>/ of its own behind (a lock file only).
    const std::string run_dir = default_run_dir();
    try {
      trainer = train::Trainer::create(std::move(run), run_dir, group, print_line);
    } catch (...) {
      std::error_code ec;
      bool unused = root && fs::is_directory(run_dir, ec);  // rank 0 made it
      for (const auto& entry : fs::directory_iterator(run_dir, ec))
        unused = unused && entry.path().filename() == ".lock";
      if (unused && !ec) fs::remove_all(run_dir, ec);
      throw;
    }
  }

  ProgressPrinter progress(stdout_is_terminal(), trainer->settings().train.log_every());
  train::TrainCallbacks callbacks;
  int64_t total_steps = 0;
  callbacks.on_step = [&](const train::StepReport& r) {
    total_steps = r.total_steps;
    if (root) progress.step(r);
  };
  callbacks.on_info = [&](const std::string& text) { progress.message(text); };
  callbacks.on_eval = [&](int64_t step, const train::EvalResult& r) {
    // The final evaluation is printed once, in the summary below.
    if (step < total_steps) {
      progress.message("eval at step " + std::to_string(step) + (r.weight_average ? ", weight average" : "") + ": " +
                       format_eval(r));
    }
  };
  callbacks.stop_requested = &g_stop;
  // Every way a run is told to stop (Ctrl-C, a scheduler's SIGTERM, a closed terminal, a closed pipe)
  // ends it after the step under way with its checkpoint saved.
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::signal(SIGHUP, on_interrupt);
  std::signal(SIGPIPE, on_broken_pipe);

  const train::TrainSummary summary = trainer->run(callbacks);
  progress.finish();
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, SIG_DFL);
  std::signal(SIGPIPE, SIG_IGN);  // the closing lines below fall back to stderr
  if (summary.interrupted) {
    say("interrupted at step " + std::to_string(summary.steps) +
        "; checkpoint saved. Continue with:\n  lockstep train --resume " + summary.run_dir + "\n");
    return kExitInterrupted;
  }
  if (summary.evaluation_skipped) {  // stopped once every step was taken: complete, not evaluated
    say("trained " + std::to_string(summary.steps) + " steps in " + format_duration(summary.seconds) +
        "; the run is complete and its checkpoint saved, but its final evaluation was skipped on request. " +
        "Evaluate it with:\n  lockstep eval " + summary.run_dir + "\n");
    return kExitInterrupted;
  }
  if (!root) {
    std::cout << "trained " << summary.steps << " steps in " << format_duration(summary.seconds)
              << " (rank 0 evaluates and writes the run directory)\n";
    return kExitOk;
  }
  std::cout << "trained " << summary.steps << " steps in " << format_duration(summary.seconds) << "\n"
            << "test: " << format_eval(summary.test) << "\n"
            << (summary.test_weight_average.images > 0
                    ? "test, weight average: " + format_eval(summary.test_weight_average) + "\n"
                    : std::string())
            << "run directory: " << summary.run_dir << " (config.toml, metrics.jsonl, checkpoint.safetensors, "
            << "reconstructions.png, summary.json)\n";
  return kExitOk;
}

}  // namespace

void add_train_command(CLI::App& app, Runner& run) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a tokenizer, or resume a run");
  cmd->footer(
      "With no options, trains an FSQ autoencoder on Fashion-MNIST (Debian package dataset-fashion-mnist) and "
      "writes runs/<date-time>/ with config.toml, metrics.jsonl, checkpoint.safetensors, reconstructions.png and "
      "summary.json. --data FOLDER trains on a tree of images instead, in resolution buckets, holding out "
      "data.eval_images of them for evaluation; the run directory then also keeps the folder's manifest.json, "
      "which a resumed run must still match. Settings: a --config file, then the flags above, then --set, later ones "
      "winning; every key is "
      "listed in docs/configuration.md (a quantizer's own in docs/quantizers.md) and by --print-config. Ctrl-C saves a "
      "checkpoint and stops; --resume "
      "continues bit for bit.");
  cmd->add_option("--config", args->config_file, "TOML file of settings (see docs/configuration.md)")
      ->check(CLI::ExistingFile)
      ->type_name("FILE");
  cmd->add_option("--set", args->sets, "Override one setting, KEY=VALUE (repeatable), e.g. --set train.lr=1e-3")
      ->type_name("KEY=VALUE");
  cmd->add_option("--rank", args->rank, "This process's rank (default: RANK from the environment)")
      ->check(kNonNegativeInt);
  cmd->add_option("--world-size", args->world_size, "Ranks in the run (default: WORLD_SIZE, else 1)")
      ->check(kPositiveInt);
  cmd->add_option("--master-addr", args->master_addr,
                  "Address of rank 0's store (default: MASTER_ADDR, else 127.0.0.1)");
  cmd->add_option("--master-port", args->master_port,
                  "Port of rank 0's store (default: MASTER_PORT, else 29500); 0 on rank 0: any free port, printed "
                  "for the other ranks")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--collective-timeout", args->collective_timeout_s,
                  "Seconds a rank waits in one collective before naming the ranks it waits for (runs started "
                  "by lockstep launch or torchrun)")
      ->capture_default_str()
      ->check(kPositiveReal)
      ->type_name("SECONDS");
  cmd->add_option("--run-dir", args->run_dir, "Where to write the run (default runs/<date-time>)")
      ->check(kNonEmptyPath)
      ->type_name("DIR");
  cmd->add_option("--resume", args->resume,
                  "Continue the run in this directory from its checkpoint, exactly where it stopped (a run "
                  "that stopped before its first checkpoint starts again from step 0)")
      ->check(kNonEmptyPath)
      ->type_name("RUN_DIR");
  cmd->add_flag("--print-config", args->print_config, "Print the resolved configuration as TOML and exit");
  // The flags that set a key, as the run settings' table declares them.
  for (const train::RunKey& k : train::run_keys()) {
    for (const auto& shortcut : k.spec.shortcuts) {
      add_shortcut(*cmd, *args, shortcut.flag, shortcut.type_name, k.spec.key, shortcut.help);
    }
  }
  cmd->callback([&run, args] { run = [args] { return run_train(*args); }; });
}

}  // namespace lockstep::cli
