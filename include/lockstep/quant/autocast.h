// Automatic mixed precision, version-neutral (LibTorch 1.13 and 2.x name these calls differently).
// Quantizers compute in float32 whatever the caller's autocast state: code choices and codebook
// statistics must not depend on bf16 rounding (NoAutocast). The trainer runs the rest of a
// training forward in bfloat16 with train.precision = bf16 (Autocast).
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace lockstep::quant {

// Autocast to `dtype` on `device` for the scope's lifetime (restored after; casts cached during the
// outermost scope are dropped when it ends).
class Autocast {
 public:
  Autocast(c10::DeviceType device, c10::ScalarType dtype);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  c10::ScalarType was_dtype_;
};

// Autocast off on the CPU and CUDA for the scope's lifetime.
class NoAutocast {
 public:
  NoAutocast();
  ~NoAutocast();
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  bool cpu_, cuda_;
};

// Whether autocast is on for `device` in this thread.
bool autocast_enabled(c10::DeviceType device);

}  // namespace lockstep::quant
