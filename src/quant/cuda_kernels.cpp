// The bridge from tensors to the CUDA kernels of src/quant/cuda: shapes, dtypes, scratch from
// torch's caching allocator, the caller's current stream, and errors as exceptions. Without CUDA
// kernels in the build (Debian's LibTorch, or no nvcc) cuda_kernels_built() is false and the
// callers keep the torch-op paths.
#include <torch/torch.h>

#include "cuda_kernels.h"
#include "fsq_kernel.h"
#include "lockstep/config_build.h"
#include "lockstep/core/error.h"

#if LOCKSTEP_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/kernels.h"
#include "fsq_noise_hash.h"
#include "smallest_k.h"
#endif

namespace lockstep::quant::detail {

bool cuda_kernels_built() { return LOCKSTEP_HAVE_CUDA_KERNELS != 0; }

#if LOCKSTEP_HAVE_CUDA_KERNELS
namespace {

void check_cuda(const at::Tensor& t, const char* what) {
  LOCKSTEP_CHECK_ARG(t.is_cuda(), what, ": the CUDA kernel needs a CUDA tensor, got one on ", t.device());
}

void check_launch(const char* error, const char* what) {
  LOCKSTEP_THROW_IF_NOT(error == nullptr, Error, what, ": CUDA kernel failed: ", error);
}

void* current_stream(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// x (n, d) and codebook (k, d), k >= 1, on one CUDA device.
void check_search(const at::Tensor& x_in, const at::Tensor& codebook_in) {
  check_cuda(x_in, "nearest_code");
  LOCKSTEP_CHECK_ARG(x_in.dim() == 2 && codebook_in.dim() == 2 && x_in.size(1) == codebook_in.size(1),
                     "nearest_code: expected x (n, d) and codebook (k, d), got ", x_in.sizes(), " and ",
                     codebook_in.sizes());
  LOCKSTEP_CHECK_ARG(codebook_in.size(0) >= 1, "nearest_code: the codebook is empty");
  LOCKSTEP_CHECK_ARG(x_in.device() == codebook_in.device(), "nearest_code: x is on ", x_in.device(),
                     " but the codebook on ", codebook_in.device());
}

// |e|^2 per code (Euclidean), the bias both CUDA searches add; undefined for cosine.
at::Tensor code_bias(const at::Tensor& codebook, Metric metric) {
  return metric == Metric::Euclidean ? codebook.square().sum(1) : at::Tensor();
}

}  // namespace

NearestCode nearest_code_cuda(const at::Tensor& x_in, const at::Tensor& codebook_in, Metric metric) {
  check_search(x_in, codebook_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.detach().to(torch::kFloat32).contiguous();
  const at::Tensor codebook = codebook_in.detach().to(torch::kFloat32).contiguous();
  const int64_t n = x.size(0), k = codebook.size(0), d = x.size(1);
  const auto on = x.options();
  NearestCode out{torch::empty({n}, on.dtype(torch::kInt64)), torch::empty({n}, on)};
  if (n == 0) return out;
  const at::Tensor bias = code_bias(codebook, metric);
  const int splits = cuda::nearest_code_splits(n, k);
  const at::Tensor partial_value = torch::empty({splits, n}, on);
  const at::Tensor partial_index = torch::empty({splits, n}, on.dtype(torch::kInt32));
  check_launch(cuda::nearest_code(x.data_ptr<float>(), codebook.data_ptr<float>(),
                                  bias.defined() ? bias.data_ptr<float>() : nullptr, n, k, d, splits,
                                  partial_value.data_ptr<float>(), partial_index.data_ptr<int32_t>(),
                                  out.indices.data_ptr<int64_t>(), out.score.data_ptr<float>(), current_stream(x)),
               "nearest_code");
  return out;
}

at::Tensor code_scores_cuda(const at::Tensor& x_in, const at::Tensor& codebook_in, Metric metric) {
  check_search(x_in, codebook_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.detach().to(torch::kFloat32).contiguous();
  const at::Tensor codebook = codebook_in.detach().to(torch::kFloat32).contiguous();
  const int64_t n = x.size(0), k = codebook.size(0), d = x.size(1);
  at::Tensor values = torch::empty({n, k}, x.options());
  const at::Tensor bias = code_bias(codebook, metric);
  check_launch(cuda::code_values(x.data_ptr<float>(), codebook.data_ptr<float>(),
                                 bias.defined() ? bias.data_ptr<float>() : nullptr, n, k, d, values.data_ptr<float>(),
                                 current_stream(x)),
               "code_scores");
  return values;
}

at::Tensor squared_norms_cuda(const at::Tensor& x_in) {
  check_cuda(x_in, "squared_norms");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.detach().to(torch::kFloat32).contiguous();
  at::Tensor norms = torch::empty({x.size(0)}, x.options());
  check_launch(
      cuda::squared_norms(x.data_ptr<float>(), x.size(0), x.size(1), norms.data_ptr<float>(), current_stream(x)),
      "squared_norms");
  return norms;
}

at::Tensor smallest_first_cuda(const at::Tensor& values_in, int64_t k) {
  check_cuda(values_in, "smallest_first");
  LOCKSTEP_CHECK_ARG(values_in.dim() == 2 && k >= 1 && k <= values_in.size(1) && k <= smallest_k::kMaxK &&
                         at::isFloatingType(values_in.scalar_type()) && values_in.scalar_type() != torch::kFloat64,
                     "smallest_first: the CUDA kernel takes floating values (n, m) narrower than float64 and 1 <= k <= "
                     "min(m, ",
                     smallest_k::kMaxK, "), got ", values_in.scalar_type(), " ", values_in.sizes(), " and k = ", k);
  const c10::cuda::CUDAGuard guard(values_in.device());
  const at::Tensor values = values_in.detach().to(torch::kFloat32).contiguous();  // exact: the order is kept
  at::Tensor out = torch::empty({values.size(0), k}, values.options().dtype(torch::kInt64));
  check_launch(cuda::smallest_k(values.data_ptr<float>(), values.size(0), values.size(1), static_cast<int>(k),
                                out.data_ptr<int64_t>(), current_stream(values)),
               "smallest_first");
  return out;
}

void fsq_forward_cuda(const FsqKernelPlan& plan, const at::Tensor& z, at::Tensor& codes, at::Tensor& indices,
                      float* derivative, const FsqNoise& noise) {
  check_cuda(z, "fsq");
  LOCKSTEP_CHECK_ARG(plan.num_levels <= cuda::kFsqMaxLevels, "fsq: ", plan.num_levels,
                     " levels, the CUDA kernel takes ", cuda::kFsqMaxLevels, " at most");
  const c10::cuda::CUDAGuard guard(z.device());
  cuda::FsqDevicePlan device;
  device.levels = static_cast<int>(plan.num_levels);
  device.symmetric = plan.symmetric;
  device.hard_clamp = plan.hard_clamp;
  // The plan's vectors repeat the per-level constants for a chunk of tokens; the first L suffice.
  for (int64_t j = 0; j < plan.num_levels; ++j) {
    device.shift[j] = plan.shift[j];
    device.scale[j] = plan.scale[j];
    device.offset[j] = plan.offset[j];
    device.half_width[j] = plan.half_width[j];
    device.step[j] = plan.step[j];
    device.derivative_scale[j] = plan.derivative_scale[j];
    device.half_width_int[j] = plan.half_width_int[j];
    device.basis[j] = plan.basis[j];
  }
  cuda::FsqDeviceNoise device_noise;
  if (noise.threshold != 0) {
    const auto keys = fsq_noise_keys(noise.seed, noise.element_offset);
    device_noise = {keys.key0, keys.key1, noise.threshold, noise.element_offset};
  }
  check_launch(cuda::fsq_forward(device, device_noise, z.data_ptr<float>(), z.numel() / plan.num_levels,
                                 codes.data_ptr<float>(), indices.data_ptr<int64_t>(), derivative, current_stream(z)),
               "fsq");
}

std::vector<at::Tensor> code_counts_and_sums_cuda(const at::Tensor& tokens_in, const at::Tensor& indices, int64_t k) {
  check_cuda(tokens_in, "code_counts_and_sums");
  const c10::cuda::CUDAGuard guard(tokens_in.device());
  const int64_t codebooks = tokens_in.size(0), d = tokens_in.size(2);
  const at::Tensor idx = indices.to(torch::kInt64);
  const bool outside = idx.numel() > 0 && (idx.lt(0) | idx.ge(k)).any().item<bool>();
  LOCKSTEP_THROW_IF_NOT(!outside, InvalidArgument, "code index ",
                        idx.masked_select(idx.lt(0) | idx.ge(k))[0].item<int64_t>(), " outside [0, ", k, ")");
  const at::Tensor tokens = tokens_in.to(torch::kFloat32).contiguous();
  const at::Tensor rows = (idx + torch::arange(codebooks, idx.options()).unsqueeze(1) * k).reshape({-1});
  // A stable sort keeps each code's tokens in token order: the order the CPU adds them in.
  const at::Tensor order = std::get<1>(rows.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const at::Tensor counts = torch::bincount(rows, {}, codebooks * k);
  const at::Tensor offsets = torch::cat({torch::zeros({1}, counts.options()), counts.cumsum(0)});
  at::Tensor sums = torch::empty({codebooks * k, d}, tokens.options().dtype(torch::kFloat64));
  check_launch(cuda::code_sums(tokens.data_ptr<float>(), order.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(),
                               codebooks * k, d, sums.data_ptr<double>(), current_stream(tokens)),
               "code_counts_and_sums");
  return {counts.to(torch::kFloat64), sums};
}

namespace {
// x (len, bits), float32, 1 <= bits <= 24, on a CUDA device.
void check_lfq_tokens(const at::Tensor& x, const char* what) {
  check_cuda(x, what);
  LOCKSTEP_CHECK_ARG(x.dim() == 2 && x.size(1) >= 1 && x.size(1) <= 24 && x.scalar_type() == torch::kFloat32, what,
                     ": expected float32 tokens (len, bits) with 1 <= bits <= 24, got ", x.scalar_type(), " ",
                     x.sizes());
}
}  // namespace

std::pair<at::Tensor, at::Tensor> lfq_halves_cuda(const at::Tensor& x_in, double z_scale) {
  check_lfq_tokens(x_in, "lfq_halves");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t len = x.size(0), bits = x.size(1), h = bits / 2;
  at::Tensor hi = torch::empty({len, int64_t{1} << h}, x.options());
  at::Tensor lo = torch::empty({len, int64_t{1} << (bits - h)}, x.options());
  check_launch(cuda::lfq_halves(x.data_ptr<float>(), len, static_cast<int>(bits), static_cast<float>(z_scale),
                                hi.data_ptr<float>(), lo.data_ptr<float>(), current_stream(x)),
               "lfq_halves");
  return {hi, lo};
}

at::Tensor lfq_halves_backward_cuda(const at::Tensor& x_in, double z_scale, const at::Tensor& dhi_in,
                                    const at::Tensor& dlo_in) {
  check_lfq_tokens(x_in, "lfq_halves_backward");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t len = x.size(0), bits = x.size(1), h = bits / 2;
  const at::Tensor dhi = dhi_in.to(torch::kFloat32).contiguous(), dlo = dlo_in.to(torch::kFloat32).contiguous();
  LOCKSTEP_CHECK_ARG(dhi.sizes() == at::IntArrayRef({len, int64_t{1} << h}) &&
                         dlo.sizes() == at::IntArrayRef({len, int64_t{1} << (bits - h)}),
                     "lfq_halves_backward: gradients ", dhi.sizes(), " and ", dlo.sizes(), " for tokens ", x.sizes());
  at::Tensor grad_x = torch::empty_like(x);
  check_launch(cuda::lfq_halves_backward(x.data_ptr<float>(), dhi.data_ptr<float>(), dlo.data_ptr<float>(), len,
                                         static_cast<int>(bits), static_cast<float>(z_scale), grad_x.data_ptr<float>(),
                                         current_stream(x)),
               "lfq_halves_backward");
  return grad_x;
}

// Tokens (len, bits) of any width: the per-sample entropy has no halves.
void check_lfq_bits(const at::Tensor& x, const char* what) {
  check_cuda(x, what);
  LOCKSTEP_CHECK_ARG(x.dim() == 2 && x.size(1) >= 1 && x.size(1) <= 64 && x.scalar_type() == torch::kFloat32, what,
                     ": expected float32 tokens (len, bits) with 1 <= bits <= 64, got ", x.scalar_type(), " ",
                     x.sizes());
}

at::Tensor lfq_per_sample_cuda(const at::Tensor& x_in, double z_scale) {
  check_lfq_bits(x_in, "lfq_per_sample");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.detach().contiguous();
  at::Tensor entropy = torch::empty({x.size(0)}, x.options());
  check_launch(cuda::lfq_per_sample(x.data_ptr<float>(), x.size(0), static_cast<int>(x.size(1)),
                                    static_cast<float>(z_scale), entropy.data_ptr<float>(), current_stream(x)),
               "lfq_per_sample");
  return entropy;
}

at::Tensor lfq_per_sample_backward_cuda(const at::Tensor& x_in, double z_scale, const at::Tensor& grad_mean_in) {
  check_lfq_bits(x_in, "lfq_per_sample_backward");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.detach().contiguous();
  const at::Tensor grad_mean = grad_mean_in.to(x.options()).reshape({1}).contiguous();
  at::Tensor grad_x = torch::empty_like(x);
  check_launch(cuda::lfq_per_sample_backward(x.data_ptr<float>(), x.size(0), static_cast<int>(x.size(1)),
                                             static_cast<float>(z_scale), grad_mean.data_ptr<float>(),
                                             grad_x.data_ptr<float>(), current_stream(x)),
               "lfq_per_sample_backward");
  return grad_x;
}

#else
// Never reached: callers ask cuda_kernels_built() first.
NearestCode nearest_code_cuda(const at::Tensor&, const at::Tensor&, Metric) {
  throw Error("nearest_code: this build has no CUDA kernels");
}
at::Tensor smallest_first_cuda(const at::Tensor&, int64_t) {
  throw Error("smallest_first: this build has no CUDA kernels");
}
at::Tensor code_scores_cuda(const at::Tensor&, const at::Tensor&, Metric) {
  throw Error("code_scores: this build has no CUDA kernels");
}
at::Tensor squared_norms_cuda(const at::Tensor&) { throw Error("squared_norms: this build has no CUDA kernels"); }
void fsq_forward_cuda(const FsqKernelPlan&, const at::Tensor&, at::Tensor&, at::Tensor&, float*, const FsqNoise&) {
  throw Error("fsq: this build has no CUDA kernels");
}
std::vector<at::Tensor> code_counts_and_sums_cuda(const at::Tensor&, const at::Tensor&, int64_t) {
  throw Error("code_counts_and_sums: this build has no CUDA kernels");
}
std::pair<at::Tensor, at::Tensor> lfq_halves_cuda(const at::Tensor&, double) {
  throw Error("lfq_halves: this build has no CUDA kernels");
}
at::Tensor lfq_halves_backward_cuda(const at::Tensor&, double, const at::Tensor&, const at::Tensor&) {
  throw Error("lfq_halves_backward: this build has no CUDA kernels");
}
at::Tensor lfq_per_sample_cuda(const at::Tensor&, double) {
  throw Error("lfq_per_sample: this build has no CUDA kernels");
}
at::Tensor lfq_per_sample_backward_cuda(const at::Tensor&, double, const at::Tensor&) {
  throw Error("lfq_per_sample_backward: this build has no CUDA kernels");
}
#endif

}  // namespace lockstep::quant::detail
