#include "lockstep/quant/fsq.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "cuda_kernels.h"
#include "fsq_kernel.h"
#include "lockstep/core/error.h"

namespace lockstep::quant {
namespace {
// Above ~64K elements a split over threads pays for itself.
constexpr int64_t kGrainElements = 1 << 16;

// The straight-through estimator around the fused kernel: forward computes codes, indices and
// d code / d z in one pass; backward is grad * (d code / d z).
struct FsqFunction : public torch::autograd::Function<FsqFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& z,
                                                const detail::FsqKernelPlan* plan, detail::FsqNoise noise) {
    at::Tensor codes = at::empty_like(z);
    at::Tensor derivative = at::empty_like(z);
    at::Tensor indices = empty_indices(z);
    run(*plan, z, codes, indices, derivative.data_ptr<float>(), noise);
    ctx->save_for_backward({derivative});
    ctx->mark_non_differentiable({indices});
    return {codes, indices};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    return {grads[0] * ctx->get_saved_variables()[0], at::Tensor(), at::Tensor()};
  }

  static at::Tensor empty_indices(const at::Tensor& z) {
    return at::empty(z.sizes().slice(0, z.dim() - 1), z.options().dtype(at::kLong));
  }

  // Runs the kernel over all tokens of z (contiguous float32) into contiguous outputs on z's device
  // (the CPU, or CUDA where the build has the kernels).
  static void run(const detail::FsqKernelPlan& plan, const at::Tensor& z, at::Tensor& codes, at::Tensor& indices,
                  float* derivative, const detail::FsqNoise& noise) {
    if (z.is_cuda()) return detail::fsq_forward_cuda(plan, z, codes, indices, derivative, noise);
    const int64_t L = plan.num_levels;
    const int64_t tokens = z.numel() / L;
    const float* zp = z.data_ptr<float>();
    float* cp = codes.data_ptr<float>();
    int64_t* ip = indices.data_ptr<int64_t>();
    const int64_t grain = std::max<int64_t>(1, kGrainElements / L);
    at::parallel_for(0, tokens, grain, [&](int64_t begin, int64_t end) {
      detail::fsq_forward_tokens(plan, zp, cp, ip, derivative, noise, begin, end);
    });
  }
};
}  // namespace

void FsqOptions::validate() const {
  check_fields("fsq", *this);
  LOCKSTEP_CHECK_ARG(!levels_.empty(), "fsq: levels must not be empty");
  int64_t product = 1;
  for (size_t i = 0; i < levels_.size(); ++i) {
    LOCKSTEP_CHECK_ARG(levels_[i] >= 2, "fsq: levels[", i, "] = ", levels_[i], " must be >= 2");
    // Beyond 2^22 float32 codes cannot be rounded exactly (nor told apart much later).
    LOCKSTEP_CHECK_ARG(levels_[i] <= (int64_t{1} << 22), "fsq: levels[", i, "] = ", levels_[i],
                       " must be <= 2^22 = 4194304");
    product *= levels_[i];
    LOCKSTEP_CHECK_ARG(product <= (int64_t{1} << 31), "fsq: the product of levels exceeds 2^31 at levels[", i,
                       "]; use several codebooks instead");
  }
  LOCKSTEP_CHECK_ARG(!dim_ || *dim_ >= 1, "fsq: dim = ", dim_.value_or(0), " must be >= 1");
  LOCKSTEP_CHECK_ARG(noise_dropout_ == 0 || preserve_symmetry_, "fsq: noise_dropout = ", noise_dropout_,
                     " needs preserve_symmetry = true (got preserve_symmetry = false)");
}

Fsq::Fsq(FsqOptions options) : Quantizer("Fsq"), options_(std::move(options)) {
  options_.validate();
  const auto& levels = options_.levels();
  const int64_t code_dim = static_cast<int64_t>(levels.size()) * options_.num_codebooks();
  dim_ = options_.dim().value_or(code_dim);
  codebook_size_ = 1;
  std::vector<int64_t> basis;
  for (int64_t l : levels) {
    basis.push_back(codebook_size_);
    codebook_size_ *= l;
  }
  levels_ = torch::tensor(levels, torch::kInt64).to(torch::kFloat32);
  basis_ = torch::tensor(basis, torch::kInt64);
  build_plan();
  if (dim_ != code_dim) {
    const bool bias = options_.projection_has_bias();
    project_in_ = register_module("project_in", torch::nn::Linear(torch::nn::LinearOptions(dim_, code_dim).bias(bias)));
    project_out_ =
        register_module("project_out", torch::nn::Linear(torch::nn::LinearOptions(code_dim, dim_).bias(bias)));
  }
  if (options_.orthogonal_rotation()) {
    const auto d = static_cast<int64_t>(levels.size());
    rotation_ = register_buffer("orthogonal_rot", torch::nn::init::orthogonal_(torch::empty({d, d})));
  }
}

void Fsq::build_plan() {
  // The constants come from the definition's own float32 tensor expressions, so that the kernel
  // multiplies and adds exactly the values torch would.
  torch::NoGradGuard no_grad;
  const int64_t L = levels_.size(0);
  const at::Tensor lm1 = levels_ - 1;
  const at::Tensor half_width = (levels_ / 2).floor();
  const at::Tensor zeros = torch::zeros_like(levels_);
  at::Tensor shift = zeros, scale, offset = zeros, step = torch::ones_like(levels_), derivative_scale;
  if (options_.preserve_symmetry()) {
    scale = lm1;
    step = 2 / lm1;
    // The reference's chain rule: * 2/(L-1), / 2, * (L-1), then the squashing function's derivative.
    derivative_scale = step / 2 * lm1;
  } else {
    const double eps = 1e-3;
    scale = lm1 * (1 + eps) / 2;
    offset = torch::where(levels_.remainder(2) == 0, torch::full_like(levels_, 0.5), zeros);
    shift = options_.bound_hard_clamp() ? offset / scale : (offset / scale).atanh();
    // The reference's chain rule: / (L div 2), * half, then the squashing function's derivative.
    derivative_scale = 1 / half_width * scale;
  }
  auto plan = std::make_shared<detail::FsqKernelPlan>();
  plan->num_levels = L;
  plan->symmetric = options_.preserve_symmetry();
  plan->hard_clamp = options_.bound_hard_clamp();
  plan->chunk_tokens = std::max<int64_t>(1, detail::kFsqChunkPositions / L);
  const int64_t positions = plan->chunk_tokens * L;
  auto repeat = [&](const at::Tensor& per_level) {
    const at::Tensor t = per_level.to(torch::kFloat32).contiguous();
    std::vector<float> out(positions);
    for (int64_t i = 0; i < positions; ++i) out[i] = t.data_ptr<float>()[i % L];
    return out;
  };
  plan->shift = repeat(shift);
  plan->scale = repeat(scale);
  plan->offset = repeat(offset);
  plan->half_width = repeat(half_width);
  plan->step = repeat(step);
  plan->derivative_scale = repeat(derivative_scale);
  plan->half_width_int.resize(positions);
  for (int64_t i = 0; i < positions; ++i) plan->half_width_int[i] = static_cast<int32_t>(plan->half_width[i]);
  plan->basis.assign(basis_.data_ptr<int64_t>(), basis_.data_ptr<int64_t>() + L);
  plan_ = std::move(plan);
}

FsqCodes Fsq::quantize_and_index(const at::Tensor& z_in, const std::optional<at::Generator>& noise,
                                 int64_t element_offset) const {
  const int64_t L = plan_->num_levels;
  LOCKSTEP_CHECK_ARG(z_in.dim() >= 1 && z_in.size(-1) == L, "fsq: expected z (..., ", L, "), got ", z_in.sizes());

  detail::FsqNoise noise_spec;
  if (noise && options_.noise_dropout() > 0) {
    at::Generator gen = noise->defined() ? *noise : at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    noise_spec.seed = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
    // Round up so that any p > 0 gives some noise; p just below 1 saturates at 2^32 - 1.
    const double threshold = std::ceil(options_.noise_dropout() * 4294967296.0);
    noise_spec.threshold = static_cast<uint32_t>(std::min(threshold, 4294967295.0));
    noise_spec.element_offset = element_offset;
  }
  if (!z_in.device().is_cpu() && !(z_in.is_cuda() && detail::cuda_kernels_built())) {
    return detail::fsq_forward_torch(*plan_, z_in, noise_spec);
  }

  const at::Tensor z = z_in.to(torch::kFloat32).contiguous();  // no copy when it already is
  if (z.requires_grad() && at::GradMode::is_enabled()) {
    const auto outputs = FsqFunction::apply(z, plan_.get(), noise_spec);
    return {outputs[0], outputs[1]};
  }
  at::Tensor codes = at::empty_like(z);
  at::Tensor indices = FsqFunction::empty_indices(z);
  FsqFunction::run(*plan_, z, codes, indices, nullptr, noise_spec);
  return {codes, indices};
}

void Fsq::quantize_and_index_out(const at::Tensor& z_in, at::Tensor& codes, at::Tensor& indices) const {
  const int64_t L = plan_->num_levels;
  LOCKSTEP_CHECK_ARG(z_in.dim() >= 1 && z_in.size(-1) == L, "fsq: expected z (..., ", L, "), got ", z_in.sizes());
  LOCKSTEP_CHECK_ARG(z_in.device().is_cpu(), "fsq: the fused kernel runs on the CPU, got z on ", z_in.device());
  const at::Tensor z = z_in.detach().to(torch::kFloat32).contiguous();
  LOCKSTEP_CHECK_ARG(codes.scalar_type() == torch::kFloat32 && codes.is_contiguous() && codes.sizes() == z.sizes(),
                     "fsq: codes must be contiguous float32 ", z.sizes(), ", got ", codes.scalar_type(), " ",
                     codes.sizes());
  LOCKSTEP_CHECK_ARG(indices.scalar_type() == torch::kInt64 && indices.is_contiguous() &&
                         indices.sizes() == z.sizes().slice(0, z.dim() - 1),
                     "fsq: indices must be contiguous int64 ", z.sizes().slice(0, z.dim() - 1), ", got ",
                     indices.scalar_type(), " ", indices.sizes());
  FsqFunction::run(*plan_, z, codes, indices, nullptr, detail::FsqNoise{});
}

at::Tensor Fsq::quantize_codes(const at::Tensor& z) const { return quantize_and_index(z).codes; }

at::Tensor Fsq::codes_to_indices(const at::Tensor& codes_in) const {
  const int64_t L = plan_->num_levels;
  LOCKSTEP_CHECK_ARG(codes_in.dim() >= 1 && codes_in.size(-1) == L, "fsq: expected codes (..., ", L, "), got ",
                     codes_in.sizes());
  if (!codes_in.device().is_cpu()) {  // the same formula in torch operations, on the codes' device
    const at::Tensor c = codes_in.detach().to(torch::kFloat32);
    const at::Tensor levels = levels_.to(c.device()), half_width = (levels / 2).floor();
    const at::Tensor level =
        options_.preserve_symmetry() ? (c + 1.0f) / (2 / (levels - 1)) : c * half_width + half_width;
    return (level.round().to(torch::kInt64) * basis_.to(c.device())).sum(-1);
  }
  const at::Tensor codes = codes_in.detach().to(torch::kFloat32).contiguous();
  at::Tensor indices = at::empty(codes.sizes().slice(0, codes.dim() - 1), codes.options().dtype(at::kLong));
  detail::fsq_codes_to_indices(*plan_, codes.data_ptr<float>(), indices.data_ptr<int64_t>(), codes.numel() / L);
  return indices;
}

at::Tensor Fsq::indices_to_codes(const at::Tensor& indices) const {
  const at::Tensor levels = levels_.to(indices.device());
  const at::Tensor level_index = indices.unsqueeze(-1)
                                     .floor_divide(basis_.to(indices.device()))
                                     .remainder(levels.to(torch::kInt64))
                                     .to(torch::kFloat32);
  if (options_.preserve_symmetry()) return level_index * (2 / (levels - 1)) - 1;
  const at::Tensor half_width = (levels / 2).floor();
  return (level_index - half_width) / half_width;
}

at::Tensor Fsq::to_code_space(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == dim_, "fsq: expected tokens (b, n, ", dim_, "), got ", x.sizes());
  at::Tensor z = project_in_ ? project_in_->forward(x) : x;
  z = z.reshape({x.size(0), x.size(1), options_.num_codebooks(), static_cast<int64_t>(options_.levels().size())});
  return rotation_.defined() ? torch::matmul(z, rotation_) : z;
}

at::Tensor Fsq::from_code_space(const at::Tensor& codes) {
  at::Tensor flat = (rotation_.defined() ? torch::matmul(codes, rotation_.t()) : codes).flatten(2);
  return project_out_ ? project_out_->forward(flat) : flat;
}

at::Tensor Fsq::squeeze_indices(const at::Tensor& indices) const {
  return options_.num_codebooks() == 1 ? indices.squeeze(-1) : indices;
}

QuantizerOutput Fsq::quantize(const at::Tensor& x, const QuantizeContext& ctx) {
  check_no_mask(ctx, "fsq");
  // FSQ is computed in float32 whatever the input precision, as the reference does.
  std::optional<at::Generator> noise;
  if (is_training() && options_.noise_dropout() > 0) noise = ctx.generator;
  const at::Tensor z = to_code_space(x);
  const int64_t per_item = x.size(0) > 0 ? z.numel() / x.size(0) : 0;
  const FsqCodes result = quantize_and_index(z, noise, ctx.first_item * per_item);
  QuantizerOutput out;
  out.indices = squeeze_indices(result.indices);
  out.quantized = from_code_space(result.codes).to(x.scalar_type());
  return out;
}

at::Tensor Fsq::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  return squeeze_indices(quantize_and_index(to_code_space(x)).indices);
}

at::Tensor Fsq::decode(const at::Tensor& indices) {
  const int64_t k = options_.num_codebooks();
  const at::Tensor idx = k == 1 ? indices.unsqueeze(-1) : indices;
  LOCKSTEP_CHECK_ARG(idx.dim() == 3 && idx.size(2) == k, "fsq: expected indices (b, n", k == 1 ? "" : ", codebooks",
                     "), got ", indices.sizes());
  LOCKSTEP_CHECK_ARG(idx.numel() == 0 || (idx.min().item<int64_t>() >= 0 && idx.max().item<int64_t>() < codebook_size_),
                     "fsq: indices must lie in [0, ", codebook_size_, ")");
  return from_code_space(indices_to_codes(idx));
}

}  // namespace lockstep::quant
