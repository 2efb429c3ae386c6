// FSQ from torch operations, for z off the CPU (CUDA): the fused kernel's definition step for step
// (fsq_kernel.cpp), on whatever device z is. torch's tanh may differ from the kernel's by an ulp,
// which moves a value within ~1e-6 of a rounding boundary to the neighbouring level; the noise is
// the kernel's counter-based hash of (seed, global element), computed in 64-bit integers masked to
// 32 bits, so the same elements get the same noise.
#include <torch/torch.h>

#include "fsq_kernel.h"
#include "fsq_noise_hash.h"

namespace lockstep::quant::detail {
namespace {

at::Tensor per_level(const std::vector<float>& values, int64_t L, const at::Tensor& like) {
  return torch::tensor(std::vector<float>(values.begin(), values.begin() + L), torch::kFloat32).to(like.device());
}

constexpr int64_t kLow32 = int64_t{0xffffffff};

at::Tensor mix32(at::Tensor h) {  // fsq_mix32 on int64 values in [0, 2^32)
  h = h.bitwise_xor(h.__rshift__(16));
  h = (h * int64_t{0x85ebca6b}).bitwise_and(kLow32);
  h = h.bitwise_xor(h.__rshift__(13));
  h = (h * int64_t{0xc2b2ae35}).bitwise_and(kLow32);
  return h.bitwise_xor(h.__rshift__(16));
}

// codes (n elements, flat) with noise dropout; element i is global element noise.element_offset + i.
// The kernel keys each chunk by its first element's high word; chunks never straddle a 2^32
// boundary in practice (an offset past 2^32 elements is 16 GiB of codes), so the high word of the
// first element is used for all.
at::Tensor add_noise(const at::Tensor& codes, const FsqNoise& noise) {
  const int64_t first = noise.element_offset;
  const auto [key0, key1] = fsq_noise_keys(noise.seed, first);
  const at::Tensor position = (torch::arange(codes.numel(), codes.options().dtype(torch::kInt64)) +
                               static_cast<int64_t>(static_cast<uint32_t>(first)))
                                  .bitwise_and(kLow32);
  const at::Tensor h =
      mix32((position * int64_t{0x9e3779b9}).bitwise_and(kLow32).bitwise_xor(static_cast<int64_t>(key0)));
  const at::Tensor g = mix32(h.bitwise_xor(static_cast<int64_t>(key1)));
  const at::Tensor u = g.__rshift__(8).to(torch::kFloat32) * (1.0f / 16777216.0f) - 0.5f;
  const at::Tensor flat = codes.reshape({-1});
  const at::Tensor noisy = (flat + u).clamp(-1.0f, 1.0f);
  return torch::where(h < static_cast<int64_t>(noise.threshold), noisy, flat).view(codes.sizes());
}

}  // namespace

FsqCodes fsq_forward_torch(const FsqKernelPlan& plan, const at::Tensor& z_in, const FsqNoise& noise) {
  const int64_t L = plan.num_levels;
  const at::Tensor z = z_in.to(torch::kFloat32);
  const at::Tensor zd = z.detach();
  at::Tensor a, t, code, level;
  const auto squash = [&](const at::Tensor& x) { return plan.hard_clamp ? x.clamp(-1.0f, 1.0f) : x.tanh(); };
  if (plan.symmetric) {
    a = zd;
    t = squash(a);
    const at::Tensor y = per_level(plan.scale, L, z) * (t + 1.0f) / 2.0f + 0.5f;
    level = y.floor();
    code = level * per_level(plan.step, L, z) - 1.0f;
  } else {
    a = zd + per_level(plan.shift, L, z);
    t = squash(a);
    const at::Tensor rounded = (t * per_level(plan.scale, L, z) - per_level(plan.offset, L, z)).round();
    code = rounded / per_level(plan.half_width, L, z);
    level = rounded + per_level(plan.half_width, L, z);
  }
  const at::Tensor basis = torch::tensor(plan.basis, torch::kInt64).to(z.device());
  FsqCodes out;
  out.indices = (level.to(torch::kInt64) * basis).sum(-1);
  if (noise.threshold != 0) code = add_noise(code, noise);
  // Straight-through: the value is the code exactly (z - z.detach() is 0), the gradient
  // derivative_scale * t'(a), as the fused kernel's backward.
  const at::Tensor squash_derivative = plan.hard_clamp ? ((a > -1.0f) & (a < 1.0f)).to(torch::kFloat32) : 1.0f - t * t;
  const at::Tensor derivative = per_level(plan.derivative_scale, L, z) * squash_derivative;
  out.codes = z.requires_grad() ? code + derivative * (z - zd) : code;
  return out;
}

}  // namespace lockstep::quant::detail
