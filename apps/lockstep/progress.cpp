#include "progress.h"

#include <cmath>
#include <iostream>
#include <sstream>

namespace lockstep::cli {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  }
  return buf;
}

void ProgressPrinter::step(const train::StepReport& r) {
  const auto now = std::chrono::steady_clock::now();
  const bool last = r.step == r.total_steps;
  if (interactive_) {
    // Redraw at most ten times a second: the terminal is slower than a training step.
    if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else if (r.step % plain_every_ != 0 && !last) {
    return;
  }
  last_draw_ = now;
  const double eta = r.images_per_s > 0 && r.step > 0 ? r.elapsed_s / r.step * (r.total_steps - r.step) : NAN;
  std::ostringstream line;
  line.setf(std::ios::fixed);
  if (interactive_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * r.step / std::max<int64_t>(1, r.total_steps));
    line << "\r[" << std::string(filled, '=') << std::string(kWidth - filled, ' ') << "] ";
  }
  line.precision(4);
  line << "step " << r.step << "/" << r.total_steps << "  epoch " << r.epoch + 1 << "/" << r.epochs << "  loss "
       << r.loss;
  line.precision(0);
  line << "  " << r.images_per_s << " img/s  ETA " << format_duration(eta);
  if (interactive_) {
    std::cout << line.str() << "\x1b[K" << std::flush;
    bar_showing_ = true;
  } else {
    std::cout << line.str() << "\n" << std::flush;
  }
}

void ProgressPrinter::message(const std::string& text) {
  // Keep the bar's last state on its line; the next step draws a fresh bar below the message.
  if (bar_showing_) std::cout << "\n";
  std::cout << text << "\n" << std::flush;
  bar_showing_ = false;
  last_draw_ = {};  // redraw the bar at the next step
}

void ProgressPrinter::finish() {
  if (bar_showing_) std::cout << "\n" << std::flush;
  bar_showing_ = false;
}

}  // namespace lockstep::cli
