// metrics.jsonl: one JSON object per line, e.g. {"kind":"train","step":50,"loss":0.02,...}.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::train {

struct MetricsRecord {
  std::string kind;  // "train", "eval", ...
  int64_t step = 0;
  std::vector<std::pair<std::string, double>> values;
};

class MetricsLog {
 public:
  // Opens `path` for appending. With `resume_step` >= 0, first drops the lines of steps after it,
  // which an interrupted run wrote past its last checkpoint and the resumed run will write again.
  MetricsLog(std::string path, int64_t resume_step = -1);

  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends one line with one write. When the write fails (a full disk), the file is cut back to
  // the end of the previous line and IoError is thrown: no half line is left behind.
  void write(const MetricsRecord& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Reads every record of a metrics.jsonl file (for tests and tools); throws CorruptInput for a
// line that is not a JSON object with "kind" and "step".
std::vector<MetricsRecord> read_metrics(const std::string& path);

}  // namespace lockstep::train
