#include "lockstep/train/metrics.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"

namespace lockstep::train {

MetricsLog::MetricsLog(std::string path, int64_t resume_step) : path_(std::move(path)) {
  if (resume_step >= 0 && std::filesystem::exists(path_)) {
    std::istringstream in(io::read_file(path_));
    std::string kept, line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      // A torn last line (crash mid-write) is dropped along with lines past the resume step.
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() <= resume_step) {
        kept += line + "\n";
      }
    }
    io::write_file_atomic(path_, kept);
  }
  out_.open(path_, std::ios::app);
  LOCKSTEP_THROW_IF_NOT(out_.good(), IoError, "cannot open ", path_, " for writing");
}

void MetricsLog::write(const MetricsRecord& record) {
  nlohmann::json j;
  j["kind"] = record.kind;
  j["step"] = record.step;
  for (const auto& [key, value] : record.values) j[key] = value;
  out_ << j.dump() << "\n";
  out_.flush();
  LOCKSTEP_THROW_IF_NOT(out_.good(), IoError, "writing ", path_, " failed");
}

std::vector<MetricsRecord> read_metrics(const std::string& path) {
  std::istringstream in(io::read_file(path));
  std::vector<MetricsRecord> records;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    LOCKSTEP_THROW_IF_NOT(j.is_object() && j.contains("kind") && j.contains("step"), CorruptInput, path, ":",
                          line_no, ": not a metrics record");
    MetricsRecord r;
    r.kind = j["kind"].get<std::string>();
    r.step = j["step"].get<int64_t>();
    for (const auto& [key, value] : j.items()) {
      if (key != "kind" && key != "step" && value.is_number()) r.values.emplace_back(key, value.get<double>());
    }
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace lockstep::train
