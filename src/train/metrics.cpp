#include "lockstep/train/metrics.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  LOCKSTEP_THROW_IF_NOT(fd_ >= 0, IoError, "cannot open ", path_, " for writing: ",
                        errno == ELOOP ? "it is a symbolic link; lockstep does not write through links (remove it)"
                                       : std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(const MetricsRecord& record) {
  nlohmann::json j;
  j["kind"] = record.kind;
  j["step"] = record.step;
  for (const auto& [key, value] : record.values) j[key] = value;
  const std::string line = j.dump() + "\n";
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      if (before >= 0 && ::ftruncate(fd_, before) != 0) {
        // The torn line stays; a resumed run drops it when it reads the file back.
      }
      throw IoError(detail::concat("writing ", path_, " failed: ", std::strerror(err), " (the line was not kept)"));
    }
    done += static_cast<size_t>(n);
  }
}

std::vector<MetricsRecord> read_metrics(const std::string& path) {
  std::istringstream in(io::read_file(path));
  std::vector<MetricsRecord> records;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    LOCKSTEP_THROW_IF_NOT(j.is_object() && j.contains("kind") && j.contains("step"), CorruptInput, path, ":", line_no,
                          ": not a metrics record");
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
