// FSQ's forward on a CUDA device: bound, round, code, level index, mixed-radix index, noise and
// the straight-through derivative in one pass, one thread per token. Each line follows the
// definition's operation order with explicitly rounded operations (no contraction into fused
// multiply-adds), as the fused CPU kernel does, so codes agree with it wherever tanh does.
#include <cuda_runtime.h>

#include "../fsq_noise_hash.h"
#include "kernels.h"

namespace lockstep::quant::cuda {
namespace {

template <bool kHardClamp>
__device__ __forceinline__ float squash(float a) {
  if constexpr (kHardClamp) return a < -1.0f ? -1.0f : (a > 1.0f ? 1.0f : a);
  return tanhf(a);
}

template <bool kSymmetric, bool kHardClamp>
__global__ void fsq_tokens(const FsqDevicePlan plan, const FsqDeviceNoise noise, const float* __restrict__ z,
                           int64_t tokens, float* __restrict__ codes, int64_t* __restrict__ indices,
                           float* __restrict__ derivative) {
  const int L = plan.levels;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t index = 0;
    for (int j = 0; j < L; ++j) {
      const int64_t e = t * L + j;
      float a, t_a, code;
      int32_t level;
      if constexpr (kSymmetric) {
        a = z[e];
        t_a = squash<kHardClamp>(a);
        const float y = __fadd_rn(__fdiv_rn(__fmul_rn(plan.scale[j], __fadd_rn(t_a, 1.0f)), 2.0f), 0.5f);
        level = static_cast<int32_t>(y);
        code = __fsub_rn(__fmul_rn(static_cast<float>(level), plan.step[j]), 1.0f);
      } else {
        a = __fadd_rn(z[e], plan.shift[j]);
        t_a = squash<kHardClamp>(a);
        const float r = rintf(__fsub_rn(__fmul_rn(t_a, plan.scale[j]), plan.offset[j]));
        code = __fdiv_rn(r, plan.half_width[j]);
        level = static_cast<int32_t>(r) + plan.half_width_int[j];
      }
      index += static_cast<int64_t>(level) * plan.basis[j];
      if (noise.threshold != 0) {
        // fsq_noise_hash.h's hash of the element's global position (low 32 bits).
        const uint32_t position = static_cast<uint32_t>(noise.element_offset + e);
        const uint32_t h = detail::fsq_mix32(position * 0x9e3779b9u ^ noise.key0);
        const uint32_t g = detail::fsq_mix32(h ^ noise.key1);
        const float u =
            __fsub_rn(__fmul_rn(static_cast<float>(static_cast<int32_t>(g >> 8)), 1.0f / 16777216.0f), 0.5f);
        const float sum = __fadd_rn(code, u);
        const float noisy = sum > 1.0f ? 1.0f : (sum < -1.0f ? -1.0f : sum);
        code = h < noise.threshold ? noisy : code;
      }
      codes[e] = code;
      if (derivative) {
        const float slope = kHardClamp ? (a > -1.0f && a < 1.0f ? 1.0f : 0.0f) : __fsub_rn(1.0f, __fmul_rn(t_a, t_a));
        derivative[e] = __fmul_rn(plan.derivative_scale[j], slope);
      }
    }
    indices[t] = index;
  }
}

}  // namespace

const char* fsq_forward(const FsqDevicePlan& plan, const FsqDeviceNoise& noise, const float* z, int64_t tokens,
                        float* codes, int64_t* indices, float* derivative, void* stream) {
  if (tokens == 0) return nullptr;
  if (plan.levels < 1 || plan.levels > kFsqMaxLevels) return "fsq_forward: levels out of range";
  const auto s = static_cast<cudaStream_t>(stream);
  constexpr int threads = 256;
  const int64_t wanted = (tokens + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 1 << 20 ? wanted : 1 << 20);  // grid-stride beyond
  if (plan.symmetric && plan.hard_clamp) {
    fsq_tokens<true, true><<<blocks, threads, 0, s>>>(plan, noise, z, tokens, codes, indices, derivative);
  } else if (plan.symmetric) {
    fsq_tokens<true, false><<<blocks, threads, 0, s>>>(plan, noise, z, tokens, codes, indices, derivative);
  } else if (plan.hard_clamp) {
    fsq_tokens<false, true><<<blocks, threads, 0, s>>>(plan, noise, z, tokens, codes, indices, derivative);
  } else {
    fsq_tokens<false, false><<<blocks, threads, 0, s>>>(plan, noise, z, tokens, codes, indices, derivative);
  }
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace lockstep::quant::cuda
