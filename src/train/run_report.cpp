#include "run_report.h"

#include <cstdio>

#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}
}  // namespace

RunReport::RunReport(const std::string& metrics_file, int64_t first_step, const RunPlan& plan, int64_t log_every,
                     const TrainCallbacks& callbacks, bool root)
    : plan_(plan),
      log_every_(log_every),
      callbacks_(callbacks),
      root_(root),
      epochs_(plan.epoch_of(plan.total_steps + plan.steps_per_epoch - 1)) {
  if (!metrics_file.empty()) metrics_.emplace(metrics_file, first_step);
}

double RunReport::elapsed_s() const { return seconds_since(start_); }

void RunReport::after_step(int64_t step, const StepFacts& facts, int64_t unreadable) {
  window_loss_ += facts.loss;
  window_wait_ += facts.waited_s;
  epoch_wait_ += facts.waited_s;
  epoch_replaced_ += facts.replaced;
  ++window_steps_;
  StepReport report{step,
                    plan_.total_steps,
                    plan_.epoch_of(step - 1),
                    epochs_,
                    window_loss_ / window_steps_,
                    window_steps_ * plan_.global_batch() / seconds_since(window_start_),
                    seconds_since(start_),
                    facts.image_width,
                    facts.image_height};
  if (callbacks_.on_step) callbacks_.on_step(report);
  if (metrics_ && logs(step)) {
    MetricsRecord record{"train",
                         step,
                         {{"epoch", static_cast<double>(report.epoch)},
                          {"loss", report.loss},
                          {"images_per_s", report.images_per_s},
                          {"elapsed_s", report.elapsed_s},
                          {"data_wait_s", window_wait_},
                          {"grad_norm", facts.grad_norm},
                          {"lr", facts.lr}}};
    if (facts.adversary) {
      record.values.emplace_back("disc_loss", facts.disc_loss);
      record.values.emplace_back("adversarial_factor", facts.adversarial_factor);
    }
    metrics_->write(record);
    window_loss_ = 0;
    window_steps_ = 0;
    window_wait_ = 0;
    window_start_ = Clock::now();
  }
  if (step % plan_.steps_per_epoch == 0 || step == plan_.total_steps) {
    // The end of an epoch (or of the run): what the data did, on every rank's behalf.
    if (metrics_) {
      metrics_->write({"epoch",
                       step,
                       {{"epoch", static_cast<double>(report.epoch)},
                        {"replaced", static_cast<double>(epoch_replaced_)},
                        {"unreadable", static_cast<double>(unreadable)},
                        {"data_wait_s", epoch_wait_}}});
    }
    if (callbacks_.on_info && root_) {
      callbacks_.on_info(detail::concat("epoch ", report.epoch + 1, " of ", epochs_, " ended at step ", step, ": ",
                                        epoch_replaced_, " images replaced (failed to decode), ", unreadable,
                                        " unreadable files left out, ", format_seconds(epoch_wait_),
                                        " waiting for data"));
    }
    epoch_replaced_ = 0;
    epoch_wait_ = 0;
  }
}

void RunReport::after_eval(int64_t step, const EvalResult& r) {
  if (!metrics_) return;  // only rank 0 evaluates
  MetricsRecord record{r.weight_average ? "eval_ema" : "eval",
                       step,
                       {{"mse", r.mse},
                        {"psnr_db", r.psnr_db},
                        {"ssim", r.ssim},
                        {"code_usage", r.code_usage},
                        {"perplexity", r.perplexity},
                        {"images", static_cast<double>(r.images)}}};
  if (r.lpips) record.values.emplace_back("lpips", *r.lpips);
  if (r.fid) record.values.emplace_back("fid", *r.fid);
  metrics_->write(record);
  if (callbacks_.on_eval) callbacks_.on_eval(step, r);
}

}  // namespace lockstep::train
