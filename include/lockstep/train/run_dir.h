// The files of a run directory: config.toml, metrics.jsonl, checkpoint.safetensors,
// reconstructions.png, summary.json, and manifest.json for an image folder.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/train/evaluate.h"

namespace lockstep::train {

std::string config_path(const std::string& run_dir);
std::string metrics_path(const std::string& run_dir);
std::string reconstructions_path(const std::string& run_dir);
std::string summary_path(const std::string& run_dir);
// Runs on an image folder: the folder's manifest when the run started, checked on resume.
std::string manifest_path(const std::string& run_dir);

// Holds a run directory for one process: an exclusive lock on RUN/.lock for as long as it lives,
// so that a second lockstep process training into the same directory is refused instead of the
// two runs overwriting each other. The lock ends with the process, however it ends.
class RunDirLock {
 public:
  // Throws InvalidArgument naming the process that holds the directory, IoError when the lock
  // file cannot be created.
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Creates `run_dir` (and parents) for a new run and locks it. Throws InvalidArgument when it
// already holds a run (a config or checkpoint) or another process holds it, and IoError naming
// it when it cannot be created or written.
std::unique_ptr<RunDirLock> prepare_new_run_dir(const std::string& run_dir);

// Removes the temporary files (NAME.tmp.PID.N) that a process killed while writing left in
// `run_dir`; call it while holding the directory's lock. Returns the names removed.
std::vector<std::string> remove_stale_temporaries(const std::string& run_dir);

// What in `run_dir` shows that its run got past its first checkpoint (written at step
// `first_checkpoint_step`): a summary.json, reconstructions.png, metrics.jsonl records past that step.
// One description per file, naming what it says; empty when the run stopped before that checkpoint.
std::vector<std::string> records_past_first_checkpoint(const std::string& run_dir, int64_t first_checkpoint_step);

// summary.json: steps, wall time and the final test evaluation ("test"), and that of the weights'
// moving average ("test_ema") when there is one.
// Without `evaluated` (interrupted, or the evaluation skipped) there are no test figures.
void write_summary(const std::string& run_dir, int64_t steps, bool interrupted, bool evaluated, double seconds,
                   const EvalResult& test, const EvalResult* test_weight_average = nullptr);

}  // namespace lockstep::train
