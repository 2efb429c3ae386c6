// Nearest-code search on a CUDA device: tiles of 128 tokens x 128 codes of dot products in
// registers (8 x 8 per thread, like a single-precision matrix product), folded at once into a
// running arg-min per token, so distances are never written to memory. The same kernel, told to,
// stores every value instead (code_values), for the searches that rank more than the nearest.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels.h"

namespace lockstep::quant::cuda {
namespace {

constexpr int kTokens = 128;  // tokens per block
constexpr int kCodes = 128;   // codes per tile
constexpr int kDepth = 8;     // dimensions per shared-memory stage
constexpr int kSide = 16;     // a block is kSide x kSide threads, each 8 tokens x 8 codes
constexpr int kThreads = kSide * kSide;
constexpr int kPer = kTokens / kSide;
constexpr int kPad = 4;  // keeps the transposed stores free of bank conflicts

// (value, index) pairs ordered by value, then index: the first of the smallest.
__device__ __forceinline__ bool before(float v, int i, float best_v, int best_i) {
  return v < best_v || (v == best_v && i < best_i);
}

// |x|^2 of a row, as every CUDA search adds it.
__device__ __forceinline__ float squared_norm(const float* xr, int d) {
  float norm = 0.0f;
  for (int c = 0; c < d; ++c) norm = fmaf(xr[c], xr[c], norm);
  return norm;
}

// Block (token tile, split): the first of the smallest bias_j - 2 x.e_j (Euclidean) or -x.e_j
// (cosine) over the split's codes, for each of the tile's tokens. Thread (ty, tx) holds tokens
// ty + 16 i and codes tx + 16 j of each tile: it sees its codes in increasing order, so a strict <
// keeps the lowest index within a thread, and the exchange across the 16 threads of a token row
// compares indices on equal values. kValues: each value is stored to values (n, k) instead, with
// the same arithmetic, and nothing is folded.
template <bool kValues>
__global__ void __launch_bounds__(kThreads)
    search_tiles(const float* __restrict__ x, const float* __restrict__ codebook, const float* __restrict__ bias, int n,
                 int k, int d, int codes_per_split, float* __restrict__ partial_value, int* __restrict__ partial_index,
                 float* __restrict__ values) {
  __shared__ float xs[kDepth][kTokens + kPad];
  __shared__ float cs[kDepth][kCodes + kPad];
  const int tid = threadIdx.x, tx = tid % kSide, ty = tid / kSide;
  const int m0 = blockIdx.x * kTokens;
  const int c_begin = blockIdx.y * codes_per_split;
  const int c_end = min(k, c_begin + codes_per_split);
  float best[kPer];
  int best_index[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    best[i] = INFINITY;
    best_index[i] = INT_MAX;
  }
  for (int n0 = c_begin; n0 < c_end; n0 += kCodes) {
    float acc[kPer][kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc[i][j] = 0.0f;
    }
    for (int k0 = 0; k0 < d; k0 += kDepth) {
      // Consecutive threads read consecutive dimensions of a row; rows past the end and
      // dimensions past d read as zero.
      for (int l = tid; l < kTokens * kDepth; l += kThreads) {
        const int r = l / kDepth, c = l % kDepth, row = m0 + r, col = k0 + c;
        xs[c][r] = row < n && col < d ? x[static_cast<int64_t>(row) * d + col] : 0.0f;
        const int code = n0 + r;
        cs[c][r] = code < c_end && col < d ? codebook[static_cast<int64_t>(code) * d + col] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int c = 0; c < kDepth; ++c) {
        float a[kPer], b[kPer];
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          a[i] = xs[c][ty + kSide * i];
          b[i] = cs[c][tx + kSide * i];
        }
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
#pragma unroll
          for (int j = 0; j < kPer; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int code = n0 + tx + kSide * j;
      if (code >= c_end) break;
      const float b = bias ? bias[code] : 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        // -2 acc is exact, so equal codes give equal values (the CPU kernel's scaling).
        const float v = bias ? fmaf(-2.0f, acc[i][j], b) : -acc[i][j];
        if constexpr (kValues) {
          const int row = m0 + ty + kSide * i;
          if (row < n) values[static_cast<int64_t>(row) * k + code] = v;
        } else if (v < best[i]) {
          best[i] = v;
          best_index[i] = code;
        }
      }
    }
  }
  // The 16 threads of a token row are 16 consecutive lanes of one warp (values stored: nothing to fold).
  if constexpr (!kValues) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      for (int offset = kSide / 2; offset > 0; offset /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, best[i], offset, kSide);
        const int oi = __shfl_xor_sync(0xffffffffu, best_index[i], offset, kSide);
        if (before(ov, oi, best[i], best_index[i])) {
          best[i] = ov;
          best_index[i] = oi;
        }
      }
      const int row = m0 + ty + kSide * i;
      if (tx == 0 && row < n) {
        partial_value[static_cast<int64_t>(blockIdx.y) * n + row] = best[i];
        partial_index[static_cast<int64_t>(blockIdx.y) * n + row] = best_index[i];
      }
    }
  }
}

// Per token: the first of the smallest over the splits (in code order), and its score. A token
// whose every value was NaN or +inf gets code 0, as on the CPU.
__global__ void finish_search(const float* __restrict__ x, int n, int d, int splits, bool euclid,
                              const float* __restrict__ partial_value, const int* __restrict__ partial_index,
                              int64_t* __restrict__ index, float* __restrict__ score) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= n) return;
  float best = INFINITY;
  int best_index = INT_MAX;
  for (int s = 0; s < splits; ++s) {
    const float v = partial_value[static_cast<int64_t>(s) * n + row];
    const int i = partial_index[static_cast<int64_t>(s) * n + row];
    if (before(v, i, best, best_index)) {
      best = v;
      best_index = i;
    }
  }
  index[row] = best_index == INT_MAX ? 0 : best_index;
  if (euclid) {
    const float squared = squared_norm(x + static_cast<int64_t>(row) * d, d) + best;
    score[row] = squared < 0.0f ? 0.0f : squared;  // NaN stays NaN, as on the CPU
  } else {
    score[row] = -best;
  }
}

__global__ void squared_norms_of(const float* __restrict__ x, int n, int d, float* __restrict__ norms) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row < n) norms[row] = squared_norm(x + static_cast<int64_t>(row) * d, d);
}

int multiprocessors() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 1;
  }
  return std::max(count, 1);
}

}  // namespace

// Enough blocks for about four per multiprocessor, splitting the codes when the tokens alone give
// too few; never more splits than code tiles.
int nearest_code_splits(int64_t n, int64_t k) {
  const int64_t token_blocks = std::max<int64_t>(1, (n + kTokens - 1) / kTokens);
  const int64_t code_tiles = std::max<int64_t>(1, (k + kCodes - 1) / kCodes);
  const int64_t wanted = (4 * int64_t{multiprocessors()} + token_blocks - 1) / token_blocks;
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, std::min<int64_t>(code_tiles, 65535)));
}

const char* nearest_code(const float* x, const float* codebook, const float* code_bias, int64_t n, int64_t k, int64_t d,
                         int splits, float* partial_value, int32_t* partial_index, int64_t* index, float* score,
                         void* stream) {
  if (n == 0) return nullptr;
  if (n > INT_MAX - kTokens || k > INT_MAX - kCodes || d > INT_MAX || splits < 1)
    return "nearest_code: sizes out of range";
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t code_tiles = (k + kCodes - 1) / kCodes;
  const int tiles_per_split = static_cast<int>((code_tiles + splits - 1) / splits);
  const dim3 grid(static_cast<unsigned>((n + kTokens - 1) / kTokens), static_cast<unsigned>(splits));
  search_tiles<false><<<grid, kThreads, 0, s>>>(x, codebook, code_bias, static_cast<int>(n), static_cast<int>(k),
                                                static_cast<int>(d), tiles_per_split * kCodes, partial_value,
                                                partial_index, nullptr);
  finish_search<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(x, static_cast<int>(n), static_cast<int>(d),
                                                                       splits, code_bias != nullptr, partial_value,
                                                                       partial_index, index, score);
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

// One split per code tile (as many as the grid takes), each block storing its tile's values.
const char* code_values(const float* x, const float* codebook, const float* code_bias, int64_t n, int64_t k, int64_t d,
                        float* values, void* stream) {
  if (n == 0) return nullptr;
  if (n > INT_MAX - kTokens || k > INT_MAX - kCodes || d > INT_MAX) return "code_values: sizes out of range";
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t code_tiles = (k + kCodes - 1) / kCodes;
  const int64_t splits = std::min<int64_t>(code_tiles, 65535);
  const int tiles_per_split = static_cast<int>((code_tiles + splits - 1) / splits);
  const dim3 grid(static_cast<unsigned>((n + kTokens - 1) / kTokens), static_cast<unsigned>(splits));
  search_tiles<true><<<grid, kThreads, 0, s>>>(x, codebook, code_bias, static_cast<int>(n), static_cast<int>(k),
                                               static_cast<int>(d), tiles_per_split * kCodes, nullptr, nullptr, values);
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

const char* squared_norms(const float* x, int64_t n, int64_t d, float* norms, void* stream) {
  if (n == 0) return nullptr;
  if (n > INT_MAX - 256 || d > INT_MAX) return "squared_norms: sizes out of range";
  squared_norms_of<<<static_cast<unsigned>((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      x, static_cast<int>(n), static_cast<int>(d), norms);
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace lockstep::quant::cuda
