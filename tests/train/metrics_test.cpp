#include "lockstep/train/metrics.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>

#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"

namespace lockstep::train {
namespace {

// A disk that fills mid-line (here: a file-size limit just past the first line) must not leave
// half a JSON line behind: the log is cut back to its last whole line and the error is an IoError.
TEST(MetricsLog, AFailedWriteLeavesNoHalfLine) {
  test_util::TempDir tmp;
  const std::string path = tmp.file("metrics.jsonl");
  MetricsLog log(path);
  log.write({"train", 1, {{"loss", 0.5}}});
  const std::string first = io::read_file(path);

  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* previous = ::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG instead
  rlimit small = old;
  small.rlim_cur = first.size() + 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    log.write({"train", 2, {{"loss", 0.25}, {"images_per_s", 1000.0}}});
  } catch (const IoError& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("the line was not kept"), std::string::npos) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, previous);
  EXPECT_TRUE(threw);
  EXPECT_EQ(io::read_file(path), first);
  log.write({"train", 3, {{"loss", 0.125}}});  // room again: the log goes on with whole lines
  const auto records = read_metrics(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].step, 3);
}

}  // namespace
}  // namespace lockstep::train
