// The fused FSQ kernel: bound, round, code, level index, mixed-radix index and the straight-through
// derivative in one pass over z, with plain loops that the compiler vectorises.
//
// No implicit floating-point contraction in this file: the definition's a * b - c are two
// roundings in torch, and a fused multiply-add would change the last bit of codes (and so
// decode() would no longer equal the forward value exactly). The polynomials use explicit fused
// multiply-adds instead (~25% faster than unfused): exact by definition, so every clone below
// gives the same bits (the baseline clone through libm's fmaf, slowly; x86-64-v3 and later have
// FMA). __builtin_fmaf rather than std::fma, whose instance from the precompiled header is not
// inlined into these functions.
// No trapping math: lets GCC if-convert (and so vectorise) the branch-free selects below; no
// value changes. std::min / fabs / copysign are avoided in the loops: their instances come from
// the precompiled header without these options and then block vectorisation.
#pragma GCC optimize("fp-contract=off", "no-trapping-math")

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fsq_kernel.h"
#include "fsq_noise_hash.h"

// Everything below is inlined into the target clones of fsq_forward_tokens, so that each clone
// compiles the loops for its own instruction set (a function left out of line is compiled once,
// for the x86-64 baseline).
#define LOCKSTEP_FSQ_INLINE inline __attribute__((always_inline))

namespace lockstep::quant::detail {
namespace {

// Round to nearest, ties to even (torch.round), for |x| < 2^22: adding 1.5 * 2^23 leaves no
// fraction bits. Plain adds, so it vectorises without SSE4.1's roundps.
LOCKSTEP_FSQ_INLINE float round_even(float x) {
  const float magic = 12582912.0f;
  return (x + magic) - magic;
}

// 2^n for integral n in [-126, 127], from the exponent bits.
LOCKSTEP_FSQ_INLINE float exp2_int(float n) {
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// e^y for y in [0, 88] (Cephes expf: y = n ln 2 + r, |r| <= ln 2 / 2, degree-7 polynomial).
LOCKSTEP_FSQ_INLINE float exp_nonneg(float y) {
  const float n = round_even(y * 1.44269504088896341f);
  const float r = __builtin_fmaf(n, 2.12194440e-4f, __builtin_fmaf(n, -0.693359375f, y));
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  p = __builtin_fmaf(p, r * r, r) + 1.0f;
  return p * exp2_int(n);
}

// tanh within 1 ulp of the correctly rounded value (checked on every 7th positive float; Cephes
// tanhf's method): an odd polynomial below |x| = 0.625, else 1 - 2 / (e^{2|x|} + 1) with the sign
// of x. Both branches are computed and one selected so that the loop has no branch. Saturates to
// +-1 from |x| ~ 9; NaN stays NaN (through the polynomial).
LOCKSTEP_FSQ_INLINE float tanh_approx(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float x2 = x * x;
  float p = -5.70498872745e-3f;
  p = __builtin_fmaf(p, x2, 2.06390887954e-2f);
  p = __builtin_fmaf(p, x2, -5.37397155531e-2f);
  p = __builtin_fmaf(p, x2, 1.33314422036e-1f);
  p = __builtin_fmaf(p, x2, -3.33332819422e-1f);
  const float small = __builtin_fmaf(p * x2, x, x);
  const float e = exp_nonneg(2.0f * ax < 88.0f ? 2.0f * ax : 88.0f);
  const float large_abs = 1.0f - 2.0f / (e + 1.0f);
  const float large = x < 0.0f ? -large_abs : large_abs;
  return ax >= 0.625f ? large : small;
}

// The bound's squashing function t(a) and its derivative: tanh, or clamp to [-1, 1] with torch 2's
// gradient (1 strictly inside, 0 from the ends on).
template <bool kHardClamp>
LOCKSTEP_FSQ_INLINE float squash(float a) {
  if constexpr (kHardClamp) return a < -1.0f ? -1.0f : (a > 1.0f ? 1.0f : a);
  return tanh_approx(a);
}
template <bool kHardClamp>
LOCKSTEP_FSQ_INLINE float squash_derivative(float a, float t) {
  if constexpr (kHardClamp) return a > -1.0f && a < 1.0f ? 1.0f : 0.0f;
  return 1.0f - t * t;
}

// One chunk of n positions (whole tokens): codes, int32 level indices and the derivative.
// Each line follows the definition's operation order so that codes match torch's bit for bit
// whenever tanh does (the approximations differ from torch's by an ulp now and then, which can
// move a value that lies within ~1e-6 of a rounding boundary to the neighbouring level).
template <bool kSymmetric, bool kHardClamp, bool kDerivative>
LOCKSTEP_FSQ_INLINE void chunk_codes(const FsqKernelPlan& plan, const float* __restrict z, float* __restrict codes,
                                     int32_t* __restrict level, float* __restrict derivative, int64_t n) {
  const float* __restrict shift = plan.shift.data();
  const float* __restrict scale = plan.scale.data();
  const float* __restrict offset = plan.offset.data();
  const float* __restrict half_width = plan.half_width.data();
  const int32_t* __restrict half_width_int = plan.half_width_int.data();
  const float* __restrict step = plan.step.data();
  const float* __restrict derivative_scale = plan.derivative_scale.data();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float a, t, code;
    int32_t lv;
    if constexpr (kSymmetric) {
      // 2/(L-1) * floor((L-1)(t(z) + 1)/2 + 0.5) - 1; the argument of floor is >= 0.5.
      a = z[i];
      t = squash<kHardClamp>(a);
      const float y = scale[i] * (t + 1.0f) / 2.0f + 0.5f;
      lv = static_cast<int32_t>(y);
      code = static_cast<float>(lv) * step[i] - 1.0f;
    } else {
      // round(t(z + shift) * half - offset) / (L div 2); level index = rounded + L div 2.
      a = z[i] + shift[i];
      t = squash<kHardClamp>(a);
      const float r = round_even(t * scale[i] - offset[i]);
      code = r / half_width[i];
      lv = static_cast<int32_t>(r) + half_width_int[i];
    }
    codes[i] = code;
    level[i] = lv;
    if constexpr (kDerivative) derivative[i] = derivative_scale[i] * squash_derivative<kHardClamp>(a, t);
  }
}

// Mixed-radix index of each token of a chunk.
template <int kLevels>
LOCKSTEP_FSQ_INLINE void chunk_indices(const int32_t* __restrict level, const int64_t* __restrict basis,
                                       int64_t* __restrict out, int64_t tokens, int64_t num_levels) {
  const int64_t L = kLevels > 0 ? kLevels : num_levels;
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t s = 0;
    for (int64_t j = 0; j < L; ++j) s += static_cast<int64_t>(level[t * L + j]) * basis[j];
    out[t] = s;
  }
}

// Noise dropout on n codes whose first element is element `first` of the whole tensor: a
// counter-based hash of (seed, element), so the result does not depend on how tokens are split.
LOCKSTEP_FSQ_INLINE void chunk_noise(const FsqNoise& noise, float* __restrict codes, int64_t first, int64_t n) {
  const auto [key0, key1] = fsq_noise_keys(noise.seed, first);
  const uint32_t base = static_cast<uint32_t>(first);
  const uint32_t threshold = noise.threshold;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = fsq_mix32((base + static_cast<uint32_t>(i)) * 0x9e3779b9u ^ key0);
    const uint32_t g = fsq_mix32(h ^ key1);
    // u in [-0.5, 0.5) from 24 bits (exact in float).
    const float u = static_cast<float>(static_cast<int32_t>(g >> 8)) * (1.0f / 16777216.0f) - 0.5f;
    const float sum = codes[i] + u;
    const float noisy = sum > 1.0f ? 1.0f : (sum < -1.0f ? -1.0f : sum);
    codes[i] = h < threshold ? noisy : codes[i];
  }
}

template <bool kSymmetric, bool kHardClamp, bool kDerivative>
LOCKSTEP_FSQ_INLINE void forward_tokens(const FsqKernelPlan& plan, const float* z, float* codes, int64_t* indices,
                                        float* derivative, const FsqNoise& noise, int64_t token_begin,
                                        int64_t token_end) {
  const int64_t L = plan.num_levels;
  alignas(64) int32_t level[kFsqChunkPositions];
  for (int64_t t0 = token_begin; t0 < token_end; t0 += plan.chunk_tokens) {
    const int64_t tokens = std::min(plan.chunk_tokens, token_end - t0);
    const int64_t first = t0 * L, n = tokens * L;
    chunk_codes<kSymmetric, kHardClamp, kDerivative>(plan, z + first, codes + first, level,
                                                     kDerivative ? derivative + first : nullptr, n);
    const int64_t* basis = plan.basis.data();
    switch (L) {  // the common small L unrolled
      case 2:
        chunk_indices<2>(level, basis, indices + t0, tokens, L);
        break;
      case 3:
        chunk_indices<3>(level, basis, indices + t0, tokens, L);
        break;
      case 4:
        chunk_indices<4>(level, basis, indices + t0, tokens, L);
        break;
      case 5:
        chunk_indices<5>(level, basis, indices + t0, tokens, L);
        break;
      case 6:
        chunk_indices<6>(level, basis, indices + t0, tokens, L);
        break;
      default:
        chunk_indices<0>(level, basis, indices + t0, tokens, L);
        break;
    }
    if (noise.threshold != 0) chunk_noise(noise, codes + first, noise.element_offset + first, n);
  }
}

}  // namespace

// On x86-64 compiled for AVX-512, AVX2 (both with FMA) and the baseline, chosen once at load time
// (ifunc); all three give the same bits. Elsewhere (aarch64) one portable build, and under
// ThreadSanitizer, whose instrumented ifunc resolver would run before its runtime starts (a crash
// at load time).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define LOCKSTEP_FSQ_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LOCKSTEP_FSQ_CLONES
#endif
LOCKSTEP_FSQ_CLONES void fsq_forward_tokens(const FsqKernelPlan& plan, const float* z, float* codes, int64_t* indices,
                                            float* derivative, const FsqNoise& noise, int64_t token_begin,
                                            int64_t token_end) {
  // Spelled out rather than through a helper lambda: a lambda would not be cloned for each target.
  if (plan.symmetric && plan.hard_clamp) {
    derivative ? forward_tokens<true, true, true>(plan, z, codes, indices, derivative, noise, token_begin, token_end)
               : forward_tokens<true, true, false>(plan, z, codes, indices, derivative, noise, token_begin, token_end);
  } else if (plan.symmetric) {
    derivative ? forward_tokens<true, false, true>(plan, z, codes, indices, derivative, noise, token_begin, token_end)
               : forward_tokens<true, false, false>(plan, z, codes, indices, derivative, noise, token_begin, token_end);
  } else if (plan.hard_clamp) {
    derivative ? forward_tokens<false, true, true>(plan, z, codes, indices, derivative, noise, token_begin, token_end)
               : forward_tokens<false, true, false>(plan, z, codes, indices, derivative, noise, token_begin, token_end);
  } else {
    derivative
        ? forward_tokens<false, false, true>(plan, z, codes, indices, derivative, noise, token_begin, token_end)
        : forward_tokens<false, false, false>(plan, z, codes, indices, derivative, noise, token_begin, token_end);
  }
}

void fsq_codes_to_indices(const FsqKernelPlan& plan, const float* codes, int64_t* indices, int64_t tokens) {
  const int64_t L = plan.num_levels;
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t s = 0;
    for (int64_t j = 0; j < L; ++j) {
      const float c = codes[t * L + j];
      // The definition's level index, then torch.round (nearbyint: ties to even).
      const float level = plan.symmetric ? (c + 1.0f) / plan.step[j] : c * plan.half_width[j] + plan.half_width[j];
      s += static_cast<int64_t>(std::nearbyint(level)) * plan.basis[j];
    }
    indices[t] = s;
  }
}

}  // namespace lockstep::quant::detail
