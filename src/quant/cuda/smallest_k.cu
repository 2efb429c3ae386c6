// Each row's k smallest values (k <= 32) on a CUDA device, in one pass over the values instead of a
// stable sort of every row: one warp per row, each lane keeping the best of its columns in registers,
// then k rounds of a shuffle reduction over the lanes' heads. The arithmetic is smallest_k.h's, which
// the CPU tests hold to smallest_first.
#include <cuda_runtime.h>

#include <climits>

#include "../smallest_k.h"
#include "kernels.h"

namespace lockstep::quant::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <int W>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    smallest_rows(const float* __restrict__ values, int64_t n, int64_t m, int k, int64_t* __restrict__ out) {
  using smallest_k::Ranked;
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;  // whole warps leave together: the shuffles below see every lane
  Ranked list[W];
#pragma unroll
  for (int i = 0; i < W; ++i) list[i] = smallest_k::empty_slot();
  const float* v = values + row * m;
  for (int64_t j = lane; j < m; j += 32) smallest_k::insert(list, smallest_k::ranked(v[j], static_cast<int32_t>(j)));
  for (int r = 0; r < k; ++r) {
    Ranked best = list[0];
    int best_lane = lane;
    for (int offset = 16; offset > 0; offset /= 2) {
      const Ranked other{__shfl_xor_sync(0xffffffffu, best.value, offset),
                         __shfl_xor_sync(0xffffffffu, best.index, offset)};
      const int other_lane = __shfl_xor_sync(0xffffffffu, best_lane, offset);
      if (smallest_k::head_before(other, other_lane, best, best_lane)) {
        best = other;
        best_lane = other_lane;
      }
    }
    if (lane == 0) out[row * k + r] = best.index;
    if (lane == best_lane) smallest_k::pop_front(list);
  }
}

template <int W>
void launch(const float* values, int64_t n, int64_t m, int k, int64_t* out, cudaStream_t stream) {
  const int64_t blocks = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  smallest_rows<W><<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(values, n, m, k, out);
}

}  // namespace

const char* smallest_k(const float* values, int64_t n, int64_t m, int k, int64_t* out, void* stream) {
  if (n == 0) return nullptr;
  if (k < 1 || k > smallest_k::kMaxK || k > m || m > INT_MAX || n > int64_t{UINT_MAX} * kWarpsPerBlock) {
    return "smallest_k: sizes out of range";
  }
  const auto s = static_cast<cudaStream_t>(stream);
  smallest_k::with_list_width(k, [&](auto width) { launch<decltype(width)::value>(values, n, m, k, out, s); });
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace lockstep::quant::cuda
