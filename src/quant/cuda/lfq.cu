// LFQ's codebook-entropy halves on a CUDA device (lfq_entropy.cpp's GEMM form): each half's entries of a
// chunk of tokens in one launch, and their backward in another, instead of a few torch operations per
// bit. The arithmetic is lfq_halves.h's, which the CPU tests hold to the CPU's loops.
#include <cuda_runtime.h>

#include <algorithm>

#include "../lfq_halves.h"
#include "kernels.h"

namespace lockstep::quant::cuda {
namespace {

// One thread per (token, entry) of each half, flattened so that small halves fill the device too.
__global__ void halves(const float* __restrict__ x, int64_t len, int bits, int h, float z_scale, float* __restrict__ hi,
                       float* __restrict__ lo) {
  const int l = bits - h;
  const int64_t hi_total = len << h, total = hi_total + (len << l);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < hi_total) {
      const int64_t t = i >> h;
      hi[i] = lfq_halves::entry(x + t * bits, h, z_scale, i & ((int64_t{1} << h) - 1));
    } else {
      const int64_t j = i - hi_total, t = j >> l;
      lo[j] = lfq_halves::entry(x + t * bits + h, l, z_scale, j & ((int64_t{1} << l) - 1));
    }
  }
}

// One warp per (token, half): its lanes take the half's entries in turn, then each bit's sum is reduced
// over the warp; grad_x = dz z_scale.
__global__ void halves_backward(const float* __restrict__ x, const float* __restrict__ dhi,
                                const float* __restrict__ dlo, int64_t len, int bits, int h, float z_scale,
                                float* __restrict__ grad_x) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= 2 * len) return;  // whole warps leave together: the shuffles below see every lane
  const int64_t t = warp / 2;
  const bool high = warp % 2 == 0;
  const int m = high ? h : bits - h, first = high ? 0 : h;
  const float* g = high ? dhi + (t << h) : dlo + (t << (bits - h));
  float dz[lfq_halves::kMaxHalfBits] = {};
  for (int64_t index = lane; index < (int64_t{1} << m); index += 32) {
    lfq_halves::add_bit_gradients(x + t * bits + first, m, z_scale, index, g[index], dz);
  }
  for (int k = 0; k < m; ++k) {
    float sum = dz[k];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) grad_x[t * bits + first + k] = sum * z_scale;
  }
}

// One thread per token: the sum of its bits' entropies.
__global__ void per_sample(const float* __restrict__ x, int64_t len, int bits, float z_scale,
                           float* __restrict__ entropy) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < len;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int j = 0; j < bits; ++j) sum += lfq_halves::bit_entropy(x[t * bits + j] * z_scale);
    entropy[t] = sum;
  }
}

// One thread per element: dL/dx = dL/d(mean) / len * z_scale * dH/dz; the mean's gradient read on the
// device (no copy to the host).
__global__ void per_sample_backward(const float* __restrict__ x, int64_t elements, int64_t len, float z_scale,
                                    const float* __restrict__ grad_mean, float* __restrict__ grad_x) {
  const float g = *grad_mean / static_cast<float>(len) * z_scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < elements;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    grad_x[i] = g * lfq_halves::bit_entropy_slope(x[i] * z_scale);
  }
}

const char* launched() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace

const char* lfq_halves(const float* x, int64_t len, int bits, float z_scale, float* hi, float* lo, void* stream) {
  if (bits < 1 || bits > 2 * lfq_halves::kMaxHalfBits) return "lfq_halves: bits out of range";
  if (len == 0) return nullptr;
  const int h = bits / 2;
  const int64_t total = (len << h) + (len << (bits - h));
  constexpr int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, int64_t{1} << 20);
  halves<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(x, len, bits, h, z_scale, hi,
                                                                                           lo);
  return launched();
}

const char* lfq_halves_backward(const float* x, const float* dhi, const float* dlo, int64_t len, int bits,
                                float z_scale, float* grad_x, void* stream) {
  if (bits < 1 || bits > 2 * lfq_halves::kMaxHalfBits) return "lfq_halves_backward: bits out of range";
  if (len == 0) return nullptr;
  constexpr int threads = 256, per_block = threads / 32;
  const int64_t blocks = (2 * len + per_block - 1) / per_block;
  if (blocks > 0x7fffffff) return "lfq_halves_backward: too many tokens";
  halves_backward<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, dhi, dlo, len, bits, bits / 2, z_scale, grad_x);
  return launched();
}

const char* lfq_per_sample(const float* x, int64_t len, int bits, float z_scale, float* entropy, void* stream) {
  if (len == 0) return nullptr;
  constexpr int threads = 256;
  const int64_t blocks = std::min<int64_t>((len + threads - 1) / threads, int64_t{1} << 20);
  per_sample<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(x, len, bits, z_scale,
                                                                                               entropy);
  return launched();
}

const char* lfq_per_sample_backward(const float* x, int64_t len, int bits, float z_scale, const float* grad_mean,
                                    float* grad_x, void* stream) {
  if (len == 0) return nullptr;
  const int64_t elements = len * bits;
  constexpr int threads = 256;
  const int64_t blocks = std::min<int64_t>((elements + threads - 1) / threads, int64_t{1} << 20);
  per_sample_backward<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, elements, len, z_scale, grad_mean, grad_x);
  return launched();
}

}  // namespace lockstep::quant::cuda
