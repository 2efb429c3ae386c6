// LFQ's codebook-entropy halves (lfq_entropy.cpp), one entry and one entry's bit gradients at a time:
// the arithmetic each thread of the CUDA kernels (cuda/lfq.cu) runs, here so that a CPU test holds it
// to the CPU's loops. A half of m <= 12 bits x (scaled by z_scale) has 2^m entries, entry i the product
// of each bit's probability, sigmoid(z) set or sigmoid(-z) clear, the first bit the most significant in
// i and the first multiplied. No torch or CUDA headers. Internal to src/quant.
#pragma once

#include <math.h>

#include <cstdint>

#include "host_device.h"

namespace lockstep::quant::lfq_halves {

constexpr int kMaxHalfBits = 12;  // tokens of at most 24 bits: h = bits / 2 and l = bits - h

// P(bit clear) = sigmoid(-z) and P(bit set) = sigmoid(z), each directly (not 1 - the other), keeping the
// relative precision of small values, as the CPU's bit_pairs.
LOCKSTEP_HOST_DEVICE inline float bit_clear(float z) { return 1.0f / (1.0f + expf(z)); }
LOCKSTEP_HOST_DEVICE inline float bit_set(float z) { return 1.0f / (1.0f + expf(-z)); }

// Entry `index` of the half of bits x[0..m).
LOCKSTEP_HOST_DEVICE inline float entry(const float* x, int m, float z_scale, int64_t index) {
  float p = 1.0f;
  for (int k = 0; k < m; ++k) {
    const float z = x[k] * z_scale;
    p *= ((index >> (m - 1 - k)) & 1) ? bit_set(z) : bit_clear(z);
  }
  return p;
}

// Adds to dz[k], for each bit k of the half, g times the derivative of entry `index` in z_k (g: dL/d entry):
// the entry times sigmoid(-z_k) where the bit is set, minus the entry times sigmoid(z_k) where it is clear
// (d sigmoid(z) / dz = sigmoid(z) sigmoid(-z)): no division by a probability that may underflow.
LOCKSTEP_HOST_DEVICE inline void add_bit_gradients(const float* x, int m, float z_scale, int64_t index, float g,
                                                   float* dz) {
  float clear[kMaxHalfBits], set[kMaxHalfBits];
  float p = 1.0f;
  for (int k = 0; k < m; ++k) {
    const float z = x[k] * z_scale;
    clear[k] = bit_clear(z);
    set[k] = bit_set(z);
    p *= ((index >> (m - 1 - k)) & 1) ? set[k] : clear[k];
  }
  const float gp = g * p;
  for (int k = 0; k < m; ++k) dz[k] += ((index >> (m - 1 - k)) & 1) ? gp * clear[k] : -gp * set[k];
}

// The per-sample entropy's term of one bit of logit z: H(sigmoid(z)), written in |z| so that both parts
// stay small and positive when the bit saturates (softplus(-|z|) + |z| sigmoid(-|z|)), as
// lfq_per_sample_entropy's torch operations; and its derivative in z, -z sigmoid(z) sigmoid(-z).
LOCKSTEP_HOST_DEVICE inline float bit_entropy(float z) {
  const float a = fabsf(z);
  return log1pf(expf(-a)) + a * bit_clear(a);
}
LOCKSTEP_HOST_DEVICE inline float bit_entropy_slope(float z) { return -z * bit_set(z) * bit_clear(z); }

}  // namespace lockstep::quant::lfq_halves
