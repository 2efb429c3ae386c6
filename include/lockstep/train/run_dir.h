// The files of a run directory: config.toml, metrics.jsonl, checkpoint.safetensors,
// reconstructions.png, summary.json, and manifest.json for an image folder.
#pragma once

#include <string>

#include "lockstep/train/evaluate.h"

namespace lockstep::train {

std::string config_path(const std::string& run_dir);
std::string metrics_path(const std::string& run_dir);
std::string reconstructions_path(const std::string& run_dir);
std::string summary_path(const std::string& run_dir);
// Runs on an image folder: the folder's manifest when the run started, checked on resume.
std::string manifest_path(const std::string& run_dir);

// Creates `run_dir` (and parents) for a new run. Throws InvalidArgument when it already holds a
// run (a config or checkpoint), and IoError naming it when it cannot be created or written.
void prepare_new_run_dir(const std::string& run_dir);

// summary.json: steps, wall time and the final test evaluation.
void write_summary(const std::string& run_dir, int64_t steps, bool interrupted, double seconds,
                   const EvalResult& test);

}  // namespace lockstep::train
