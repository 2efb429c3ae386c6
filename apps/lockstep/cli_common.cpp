#include "cli_common.h"

#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <new>
#include <sstream>
#include <thread>

#include "commands.h"
#include "lockstep/core/error.h"
#include "lockstep/core/memory.h"
#include "lockstep/core/threads.h"
#include "lockstep/dist/collective.h"
#include "lockstep/io/json_error.h"
#include "lockstep/train/trainer.h"

namespace lockstep::cli {

namespace {

CLI::Validator integer_at_least(long long low) {
  return CLI::Validator(
      [low](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno == ERANGE || v < low) {
          return "must be a whole number >= " + std::to_string(low) + " (at most 9223372036854775807), not '" +
                 text.substr(0, 40) + "'";
        }
        return "";
      },
      "INT >= " + std::to_string(low));
}

CLI::Validator real_above(bool inclusive) {
  return CLI::Validator(
      [inclusive](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || (!inclusive && v == 0)) {
          return std::string("must be a finite number ") + (inclusive ? ">= 0" : "> 0") + ", not '" +
                 text.substr(0, 40) + "'";
        }
        return "";
      },
      inclusive ? "NUMBER >= 0" : "NUMBER > 0");
}

}  // namespace

const CLI::Validator kNonEmptyPath = CLI::Validator(
    [](std::string& text) -> std::string {
      return text.empty() ? "must name a file or directory, not an empty string" : "";
    },
    "PATH");
const CLI::Validator kPositiveInt = integer_at_least(1);
const CLI::Validator kNonNegativeInt = integer_at_least(0);
const CLI::Validator kPositiveReal = real_above(false);
const CLI::Validator kNonNegativeReal = real_above(true);

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("--threads", threads, kThreadsHelp)->check(kNonNegativeInt);
}

void add_weight_average_option(CLI::App& cmd, bool& weight_average) {
  cmd.add_flag("--ema", weight_average,
               "Use the moving average of the weights (kept by runs trained with train.ema_decay > 0)");
}

ThreadChoice apply_threads(int threads) {
  const ThreadChoice choice = choose_threads(threads);
  at::set_num_threads(choice.threads);
  return choice;
}

bool stdout_is_terminal() { return isatty(fileno(stdout)) != 0; }

void announce_store_port(int port) {
  const char* text = std::getenv(kStorePortFdEnv);
  if (!text || !*text) return;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  unsetenv(kStorePortFdEnv);  // once: a process this one starts must not write there
  if (*end != '\0' || fd < 3) return;
  const std::string line = std::to_string(port) + "\n";
  (void)!::write(static_cast<int>(fd), line.data(), line.size());
  ::close(static_cast<int>(fd));
}

std::string format_eval(const train::EvalResult& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "mse %.5f  psnr %.2f dB  codes used %lld/%lld (%.1f%%)  perplexity %.1f  ssim %.4f",
                r.mse, r.psnr_db, static_cast<long long>(r.codes_used), static_cast<long long>(r.codebook_size),
                100.0 * r.code_usage, r.perplexity, r.ssim);
  std::string line = buf;
  if (r.lpips) {
    std::snprintf(buf, sizeof buf, "  lpips %.4f", *r.lpips);
    line += buf;
  }
  if (r.fid) {
    std::snprintf(buf, sizeof buf, "  rfid %.2f", *r.fid);
    line += buf;
  }
  return line;
}

std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

void check_forward_fits(const model::AutoencoderImpl& model, int64_t images, int64_t width, int64_t height) {
  check_fits_in_memory(
      4.0 * static_cast<double>(images) * static_cast<double>(model.inference_floats_per_image(height, width)),
      detail::concat("a forward pass on ", images, " images of ", width, "x", height,
                     " (--batch-size sets how many at a time)"));
}

int report_current_exception() {
  try {
    throw;
  } catch (const UsageError& e) {
    report_error(e.what());
    return kExitUsage;
  } catch (const dist::CollectiveMismatch& e) {
    report_error(e.what());
    return kExitRanksDiffer;
  } catch (const dist::ReplicaDivergence& e) {
    report_error(e.what());
    return kExitRanksDiffer;
  } catch (const dist::CollectiveFailure& e) {  // PeerLost, CollectiveTimeout, a failed rendezvous
    report_error(e.what());
    return kExitRankLost;
  } catch (const train::TrainingDiverged& e) {
    report_error(e.what());
    return kExitDiverged;
  } catch (const InternalError& e) {
    report_error(e.what());
    return kExitInternal;
  } catch (const c10::Error& e) {
    // LibTorch's C++ stack frames tell a user nothing, nor does its allocator's advice: what to change does.
    std::string text = e.what_without_backtrace();
    for (const char* sign : {"can't allocate memory", "not enough memory", "out of memory"}) {
      if (text.find(sign) == std::string::npos) continue;
      text = detail::concat(
          "out of memory: the sizes asked for (batch, image, model or codebook) need more memory "
          "than ",
          text.find("CUDA") != std::string::npos ? "the GPU" : "this machine",
          " can give; a smaller --batch-size may fit (", text.substr(0, text.find_first_of(".\n")), ")");
      break;
    }
    report_error(text);
    return kExitError;
  } catch (const std::bad_alloc&) {
    report_error(
        "out of memory: the sizes asked for (batch, image, model or codebook) need more memory than this "
        "machine can give");
    return kExitError;
  } catch (const std::exception& e) {
    // InvalidArgument, CorruptInput, IoError, and what torch, the standard library and the JSON
    // library throw (the latter's internal tag removed).
    report_error(io::json_error_text(e));
    return kExitError;
  }
}

void report_error(const std::string& full_message) {
  // A message that quotes what it was given (a 10 MB path, a long list) is shown by its two ends.
  constexpr size_t kHead = 2400, kTail = 800;
  const std::string message =
      full_message.size() <= kHead + kTail + 200
          ? full_message
          : detail::concat(full_message.substr(0, kHead), " ... (", full_message.size() - kHead - kTail,
                           " characters left out) ... ", full_message.substr(full_message.size() - kTail));
  std::cerr << "lockstep: error: " << message << "\n";
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) return;
  nlohmann::json error;
  error["message"]["message"] = "lockstep: " + message;
  error["message"]["extraInfo"]["py_callstack"] = "(a C++ program: no Python stack)";
  error["message"]["extraInfo"]["timestamp"] = std::to_string(std::time(nullptr));
  std::ofstream out(path);
  // A message may quote bytes that are not UTF-8 (a file name): replaced, so that dump cannot throw.
  out << error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (!out) std::cerr << "lockstep: could not write the error to TORCHELASTIC_ERROR_FILE=" << path << "\n";
}

}  // namespace lockstep::cli
