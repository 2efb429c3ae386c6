// The quantizers' CUDA kernels, called from src/quant/cuda_kernels.cpp with raw device pointers and
// the caller's stream: no torch here, so these files compile in seconds with nvcc alone. Each call
// returns nullptr once its kernels are queued, or the CUDA error's text. Internal to src/quant.
#pragma once

#include <cstdint>

namespace lockstep::quant::cuda {

// Nearest-code search with a running arg-min: no (n, k) matrix. Codes are split into `splits`
// contiguous ranges, each searched by its own blocks into partial_value / partial_index
// (splits x n each); a second kernel takes the first of the smallest in range order, so exact ties
// go to the lowest code index. code_bias: |e|^2 per code (Euclidean), or null (cosine: largest x.e).
// score: Euclidean max(|x|^2 + |e|^2 - 2 x.e, 0), cosine x.e.
int nearest_code_splits(int64_t n, int64_t k);
const char* nearest_code(const float* x, const float* codebook, const float* code_bias, int64_t n, int64_t k, int64_t d,
                         int splits, float* partial_value, int32_t* partial_index, int64_t* index, float* score,
                         void* stream);
// Every value nearest_code compares, stored to values (n, k) row-major, with its arithmetic (its
// tile kernel, told to store): nearest_code's index is the first of each row's smallest.
const char* code_values(const float* x, const float* codebook, const float* code_bias, int64_t n, int64_t k, int64_t d,
                        float* values, void* stream);
// Each row's k smallest of values (n, m) row-major, 1 <= k <= 32, into out (n, k): smallest first, equal
// values by column, NaN as +inf (smallest_first's order; the lists and merge of smallest_k.h).
const char* smallest_k(const float* values, int64_t n, int64_t m, int k, int64_t* out, void* stream);
// |x|^2 of each row (n), as nearest_code adds it to its Euclidean score.
const char* squared_norms(const float* x, int64_t n, int64_t d, float* norms, void* stream);

// FSQ's per-dimension constants (the fused CPU kernel's plan, src/quant/fsq_kernel.h), by value.
constexpr int kFsqMaxLevels = 32;  // levels >= 2 with a product <= 2^31: at most 31
struct FsqDevicePlan {
  int levels = 0;
  bool symmetric = false;
  bool hard_clamp = false;
  float shift[kFsqMaxLevels], scale[kFsqMaxLevels], offset[kFsqMaxLevels], half_width[kFsqMaxLevels],
      step[kFsqMaxLevels], derivative_scale[kFsqMaxLevels];
  int32_t half_width_int[kFsqMaxLevels];
  int64_t basis[kFsqMaxLevels];
};
// Noise dropout: element i of z (global element element_offset + i) gets noise when its hash is
// below threshold (0: none); key0 and key1 from fsq_noise_keys(seed, element_offset).
struct FsqDeviceNoise {
  uint32_t key0 = 0, key1 = 0, threshold = 0;
  int64_t element_offset = 0;
};
// One pass over z (tokens, levels): codes, indices and, when derivative is not null, d code / d z.
const char* fsq_forward(const FsqDevicePlan& plan, const FsqDeviceNoise& noise, const float* z, int64_t tokens,
                        float* codes, int64_t* indices, float* derivative, void* stream);

// Per-code float64 sums of d-dimensional float32 tokens, in a fixed order: order lists the token
// rows grouped by code (a stable sort of their codes, so each code's tokens in token order) and
// offsets (codes + 1) where each code's group starts. Every sum adds its tokens one after another,
// as the CPU loop does, so the results equal the CPU's bit for bit, on every run.
const char* code_sums(const float* tokens, const int64_t* order, const int64_t* offsets, int64_t codes, int64_t d,
                      double* sums, void* stream);

// LFQ's codebook-entropy halves (lfq_entropy.cpp, lfq_halves.h) of float32 tokens x (len, bits), 1 <= bits
// <= 24, h = bits / 2: hi (len, 2^h) of the first h bits, lo (len, 2^(bits - h)) of the others.
const char* lfq_halves(const float* x, int64_t len, int bits, float z_scale, float* hi, float* lo, void* stream);
// Their backward: dhi, dlo (dL/d hi, dL/d lo) -> grad_x (len, bits) = dL/dx.
const char* lfq_halves_backward(const float* x, const float* dhi, const float* dlo, int64_t len, int bits,
                                float z_scale, float* grad_x, void* stream);

// LFQ's per-sample entropy of float32 tokens x (len, bits): entropy (len) the sum of each token's bits'
// entropies (lfq_halves::bit_entropy); and the backward of their mean, grad_mean a device scalar.
const char* lfq_per_sample(const float* x, int64_t len, int bits, float z_scale, float* entropy, void* stream);
const char* lfq_per_sample_backward(const float* x, int64_t len, int bits, float z_scale, const float* grad_mean,
                                    float* grad_x, void* stream);

}  // namespace lockstep::quant::cuda
