// lockstep: train, evaluate and use image tokenizers. Each subcommand lives in its own file.
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <new>

#include "blas_env.h"
#include "cli_common.h"
#include "commands.h"
#include "lockstep/config_build.h"
#include "lockstep/core/error.h"

int main(int argc, char** argv) {
  // May re-execute this program once with OPENBLAS_CORETYPE set (it is read at library load).
  lockstep::cli::ensure_fast_blas(argc, argv);
  // LibTorch's own warnings (a TCPStore's "Broken pipe" with a stack trace, for each try, when a
  // stopped rank wakes after rank 0 gave up) say nothing lockstep's errors do not: errors only,
  // unless the user asks for more with TORCH_CPP_LOG_LEVEL.
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = 2;  // c10's ERROR

  CLI::App app{
      "lockstep: train vector-quantized image tokenizers on one process or many, "
      "where ranks cannot silently hang or disagree."};
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 done; 1 bad input or environment (configuration, data, files); 2 bad command line; "
      "3 a rank died or stalled (resume may succeed); 4 ranks disagreed (collective, model or data); "
      "5 training diverged; 70 a bug in lockstep; 130 interrupted (checkpoint saved).");
  app.set_version_flag("--version", std::string("lockstep ") + LOCKSTEP_VERSION);
  lockstep::cli::Runner run;
  lockstep::cli::add_train_command(app, run);
  lockstep::cli::add_eval_command(app, run);
  lockstep::cli::add_encode_command(app, run);
  lockstep::cli::add_decode_command(app, run);
  lockstep::cli::add_doctor_command(app, run);
  lockstep::cli::add_bench_command(app, run);
  lockstep::cli::add_launch_command(app, run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (argc < 2) {
      // Bare `lockstep`: show what it can do rather than only what is missing.
      std::cout << app.help();
      std::cerr << "lockstep: a subcommand is required\n";
      return lockstep::cli::kExitUsage;
    }
    // Where a subcommand was wanted (`lockstep WORD`, `lockstep bench WORD`), name the word given.
    CLI::App* at = &app;
    std::string path = "lockstep";
    int i = 1;
    for (; i < argc; ++i) {
      CLI::App* sub = nullptr;
      for (CLI::App* s : at->get_subcommands([](const CLI::App*) { return true; })) {
        if (s->get_name() == argv[i]) sub = s;
      }
      if (!sub) break;
      at = sub;
      path += std::string(" ") + argv[i];
    }
    std::vector<std::string> names;
    for (const CLI::App* sub : at->get_subcommands([](const CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
    }
    if (!names.empty() && i < argc) {
      std::cerr << "lockstep: " << (argv[i][0] == '-' ? "unknown option '" : "unknown subcommand '") << argv[i]
                << "' for " << path << "; give one of: " << lockstep::detail::concat_list(names) << "\n";
      return lockstep::cli::kExitUsage;
    }
    app.exit(e);
    return lockstep::cli::kExitUsage;
  }

  try {
    return run();
  } catch (const std::exception&) {
    // An error report and the exit status of its class, never a crash.
    return lockstep::cli::report_current_exception();
  }
}
