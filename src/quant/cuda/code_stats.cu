// Per-code float64 sums of tokens on a CUDA device without atomics: one warp per code adds that
// code's tokens one after another, in token order, as the CPU loop does, so the sums are the same
// on every run and equal to the CPU's.
#include <cuda_runtime.h>

#include "kernels.h"

namespace lockstep::quant::cuda {
namespace {

constexpr int kUnroll = 8;  // loads issued before their (ordered) additions

__global__ void sum_groups(const float* __restrict__ tokens, const int64_t* __restrict__ order,
                           const int64_t* __restrict__ offsets, int64_t codes, int d, double* __restrict__ sums) {
  const int64_t code = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (code >= codes) return;
  const int64_t begin = offsets[code], end = offsets[code + 1];
  for (int col = lane; col < d; col += 32) {
    double sum = 0.0;
    int64_t p = begin;
    for (; p + kUnroll <= end; p += kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = tokens[order[p + u] * d + col];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum += static_cast<double>(v[u]);
    }
    for (; p < end; ++p) sum += static_cast<double>(tokens[order[p] * d + col]);
    sums[code * d + col] = sum;
  }
}

}  // namespace

const char* code_sums(const float* tokens, const int64_t* order, const int64_t* offsets, int64_t codes, int64_t d,
                      double* sums, void* stream) {
  if (codes == 0 || d == 0) return nullptr;
  constexpr int threads = 256, per_block = threads / 32;
  const int64_t blocks = (codes + per_block - 1) / per_block;
  if (blocks > 0x7fffffff || d > 0x7fffffff) return "code_sums: sizes out of range";
  sum_groups<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      tokens, order, offsets, codes, static_cast<int>(d), sums);
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace lockstep::quant::cuda
