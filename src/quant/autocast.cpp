#include "lockstep/quant/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {
#if TORCH_VERSION_MAJOR >= 2
bool enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void set_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
c10::ScalarType dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void set_dtype(c10::DeviceType d, c10::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
bool enabled(c10::DeviceType d) {
  return d == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_enabled(c10::DeviceType d, bool on) {
  d == c10::kCUDA ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
c10::ScalarType dtype(c10::DeviceType d) {
  return d == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void set_dtype(c10::DeviceType d, c10::ScalarType t) {
  d == c10::kCUDA ? at::autocast::set_autocast_gpu_dtype(t) : at::autocast::set_autocast_cpu_dtype(t);
}
#endif
}  // namespace

bool autocast_enabled(c10::DeviceType device) { return enabled(device); }

Autocast::Autocast(c10::DeviceType device, c10::ScalarType dtype_)
    : device_(device), was_enabled_(enabled(device)), was_dtype_(dtype(device)) {
  LOCKSTEP_CHECK_ARG(device == c10::kCPU || device == c10::kCUDA, "autocast: only cpu and cuda, got ", device);
  set_dtype(device, dtype_);
  set_enabled(device, true);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_, was_enabled_);
  set_dtype(device_, was_dtype_);
}

NoAutocast::NoAutocast() : cpu_(enabled(c10::kCPU)), cuda_(enabled(c10::kCUDA)) {
  set_enabled(c10::kCPU, false);
  set_enabled(c10::kCUDA, false);
}

NoAutocast::~NoAutocast() {
  set_enabled(c10::kCPU, cpu_);
  set_enabled(c10::kCUDA, cuda_);
}

}  // namespace lockstep::quant
