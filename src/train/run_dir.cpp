#include "lockstep/train/run_dir.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>
#include <system_error>

#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/train/checkpoint.h"

namespace lockstep::train {
namespace fs = std::filesystem;

std::string config_path(const std::string& run_dir) { return (fs::path(run_dir) / "config.toml").string(); }
std::string metrics_path(const std::string& run_dir) { return (fs::path(run_dir) / "metrics.jsonl").string(); }
std::string reconstructions_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "reconstructions.png").string();
}
std::string summary_path(const std::string& run_dir) { return (fs::path(run_dir) / "summary.json").string(); }
std::string manifest_path(const std::string& run_dir) { return (fs::path(run_dir) / "manifest.json").string(); }

namespace {

// The pid the lock's holder wrote into the lock file, when that process is alive. The file keeps the
// pid of whoever held the lock last, and a new holder writes its own just after taking the lock: a
// pid of a process that has ended is stale, so the holder gets a moment to write, then "" (unknown).
std::string live_holder_pid(int fd) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    char text[32] = {0};
    const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
    char* end = nullptr;
    const long pid = n > 0 ? std::strtol(text, &end, 10) : 0;
    if (pid > 0 && end == text + n && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM))
      return std::to_string(pid);
    ::usleep(10 * 1000);
  }
  return "";
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / ".lock").string();
  // O_NOFOLLOW: a link planted at .lock must not have its target truncated to our pid.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  LOCKSTEP_THROW_IF_NOT(fd_ >= 0, IoError, "cannot lock run directory ", run_dir, ": cannot open ", path, ": ",
                        errno == ELOOP ? "it is a symbolic link; lockstep does not write through links (remove it)"
                                       : std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = live_holder_pid(fd_);
    ::close(fd_);
    fd_ = -1;
    throw InvalidArgument(detail::concat("run directory ", run_dir, " is in use by another lockstep process",
                                         holder.empty() ? " (its pid is not recorded yet)" : " (pid " + holder + ")",
                                         "; wait for it to finish, or choose another --run-dir"));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // The pid is only for the message above; the lock itself holds.
  }
  // Every writer of the directory holds this lock, so its files are checked here, before any work:
  // the writes refuse a link anyway (io::write_file_atomic), but only when they come, after training.
  std::vector<std::string> links;
  for (const std::string& file : {config_path(run_dir), checkpoint_path(run_dir), metrics_path(run_dir),
                                  summary_path(run_dir), reconstructions_path(run_dir), manifest_path(run_dir)}) {
    std::error_code ec;
    if (fs::is_symlink(file, ec)) links.push_back(fs::path(file).filename().string());
  }
  if (!links.empty()) {
    ::close(fd_);
    fd_ = -1;
    throw IoError(detail::concat("run directory ", run_dir, " holds ",
                                 links.size() == 1 ? "a symbolic link" : "symbolic links",
                                 " where lockstep writes its files: ", detail::concat_list(links),
                                 "; lockstep does not write through links (remove ", links.size() == 1 ? "it" : "them",
                                 ", or choose another --run-dir)"));
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race)
}

std::unique_ptr<RunDirLock> prepare_new_run_dir(const std::string& run_dir) {
  LOCKSTEP_CHECK_ARG(!run_dir.empty(), "the run directory must not be empty");
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  LOCKSTEP_THROW_IF_NOT(!ec && fs::is_directory(run_dir), IoError, "cannot create run directory ", run_dir, ": ",
                        ec ? ec.message() : "a file of that name exists");
  auto lock = std::make_unique<RunDirLock>(run_dir);  // first: no other process can start a run here now
  LOCKSTEP_CHECK_ARG(!fs::exists(config_path(run_dir)) && !fs::exists(checkpoint_path(run_dir)), "run directory ",
                     run_dir, " already holds a run; choose another --run-dir, or continue it with --resume ", run_dir);
  // Fail now, not after minutes of training, when the directory cannot be written.
  const std::string probe = (fs::path(run_dir) / ".write-test").string();
  io::write_file_atomic(probe, "");
  fs::remove(probe, ec);
  return lock;
}

std::vector<std::string> remove_stale_temporaries(const std::string& run_dir) {
  static const std::regex temporary(R"(.+\.tmp\.[0-9]+\.[0-9]+)");  // what io::write_file_atomic names them
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec) || !std::regex_match(name, temporary)) continue;
    if (fs::remove(entry.path(), ec)) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::vector<std::string> records_past_first_checkpoint(const std::string& run_dir, int64_t first_checkpoint_step) {
  std::vector<std::string> found;
  if (fs::exists(summary_path(run_dir))) {
    std::string says;
    try {  // a damaged summary still shows that the run finished or was stopped with a checkpoint
      const auto j = nlohmann::json::parse(io::read_file(summary_path(run_dir)));
      says = detail::concat(" (", j.at("interrupted").get<bool>() ? "interrupted at step " : "trained ",
                            j.at("steps").get<int64_t>(), j.at("interrupted").get<bool>() ? "" : " steps", ")");
    } catch (const std::exception&) {
    }
    found.push_back("summary.json" + says);
  }
  if (fs::exists(reconstructions_path(run_dir))) found.push_back("reconstructions.png (the final evaluation's)");
  int64_t last_step = -1;
  if (fs::exists(metrics_path(run_dir))) {
    std::istringstream in(io::read_file(metrics_path(run_dir)));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer()) {
        last_step = std::max(last_step, j["step"].get<int64_t>());
      }
    }
  }
  if (last_step > first_checkpoint_step) {
    found.push_back(detail::concat("metrics.jsonl (records up to step ", last_step,
                                   ", past the first checkpoint at step ", first_checkpoint_step, ")"));
  }
  return found;
}

void write_summary(const std::string& run_dir, int64_t steps, bool interrupted, bool evaluated, double seconds,
                   const EvalResult& test, const EvalResult* test_weight_average) {
  const auto evaluation = [](const EvalResult& r) {
    nlohmann::json j{{"images", r.images},         {"mse", r.mse},
                     {"psnr_db", r.psnr_db},       {"code_usage", r.code_usage},
                     {"codes_used", r.codes_used}, {"codebook_size", r.codebook_size},
                     {"perplexity", r.perplexity}, {"ssim", r.ssim}};
    if (r.lpips) j["lpips"] = *r.lpips;
    if (r.fid) j["fid"] = *r.fid;
    return j;
  };
  nlohmann::json j;
  j["steps"] = steps;
  j["interrupted"] = interrupted;
  j["evaluated"] = evaluated;
  j["seconds"] = seconds;
  if (evaluated) {
    j["test"] = evaluation(test);
    if (test_weight_average) j["test_ema"] = evaluation(*test_weight_average);
  }
  io::write_file_atomic(summary_path(run_dir), j.dump(2) + "\n");
}

}  // namespace lockstep::train
