// Training progress for people: a bar redrawn in place on a terminal, plain lines otherwise.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "lockstep/train/trainer.h"

namespace lockstep::cli {

class ProgressPrinter {
 public:
  // `interactive`: stdout is a terminal. `plain_every`: steps between lines when it is not.
  ProgressPrinter(bool interactive, int64_t plain_every) : interactive_(interactive), plain_every_(plain_every) {}

  void step(const train::StepReport& r);
  // Prints a line of its own (ends the bar's line first when one is showing).
  void message(const std::string& text);
  void finish();

 private:
  bool interactive_;
  int64_t plain_every_;
  bool bar_showing_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);

}  // namespace lockstep::cli
