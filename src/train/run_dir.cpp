#include "lockstep/train/run_dir.h"

#include <nlohmann/json.hpp>

#include <filesystem>
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

void prepare_new_run_dir(const std::string& run_dir) {
  LOCKSTEP_CHECK_ARG(!run_dir.empty(), "the run directory must not be empty");
  LOCKSTEP_CHECK_ARG(!fs::exists(config_path(run_dir)) && !fs::exists(checkpoint_path(run_dir)), "run directory ",
                     run_dir, " already holds a run; continue it with --resume ", run_dir,
                     ", or choose another --run-dir");
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  LOCKSTEP_THROW_IF_NOT(!ec && fs::is_directory(run_dir), IoError, "cannot create run directory ", run_dir, ": ",
                        ec ? ec.message() : "a file of that name exists");
  // Fail now, not after minutes of training, when the directory cannot be written.
  const std::string probe = (fs::path(run_dir) / ".write-test").string();
  io::write_file_atomic(probe, "");
  fs::remove(probe, ec);
}

void write_summary(const std::string& run_dir, int64_t steps, bool interrupted, double seconds,
                   const EvalResult& test) {
  nlohmann::json j;
  j["steps"] = steps;
  j["interrupted"] = interrupted;
  j["seconds"] = seconds;
  if (!interrupted) {
    j["test"] = {{"images", test.images},         {"mse", test.mse},
                 {"psnr_db", test.psnr_db},       {"code_usage", test.code_usage},
                 {"codes_used", test.codes_used}, {"codebook_size", test.codebook_size},
                 {"perplexity", test.perplexity}};
  }
  io::write_file_atomic(summary_path(run_dir), j.dump(2) + "\n");
}

}  // namespace lockstep::train
