#include "lockstep/quant/fsp.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>

#include "lockstep/core/error.h"
#include "quant/torch_op_paths.h"

namespace lockstep::quant {
namespace {

constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kPi = 3.14159265358979323846;
constexpr double kBinStd = 0.28867513459481287;  // sqrt(1/12): the std of a uniform bin value in [0, 1]
constexpr double kStdFloor = 1e-8;               // the regulariser's floor on a channel's std
constexpr double kConstantSpread = 1e-6;         // variance / mean^2 below which a channel counts as constant

// One 64-bit key from the context's generator (torch's default CPU generator when undefined).
uint64_t draw_key(const QuantizeContext& ctx) {
  at::Generator gen = ctx.generator.defined() ? ctx.generator : at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

}  // namespace

const std::vector<std::string>& choice_names(FspActivation) {
  static const std::vector<std::string> names = {"tanh", "sigmoid", "normal", "laplace", "cauchy"};
  return names;
}

FspActivation fsp_activation(const std::string& name) {
  return choice_from_name<FspActivation>("fsp", "activation", name);
}

std::string fsp_activation_name(FspActivation activation) { return choice_name(activation); }

const std::vector<std::string>& choice_names(FspNormPreset) {
  static const std::vector<std::string> names = {"none", "var", "kurt", "var_tanh", "var_sigmoid", "var_laplace"};
  return names;
}

FspNorm FspNorm::preset(FspNormPreset preset) {
  // (targets, weights) of mean, variance, skewness, excess kurtosis, as the reference's presets, in the
  // enum's order.
  static constexpr std::array<double, 4> kPresets[][2] = {{{0, 1, 0, 0}, {0, 0, 0, 0}},             // none
                                                          {{0, 1, 0, 0}, {0.1, 0.07, 0, 0}},        // var
                                                          {{0, 1, 0, 0}, {0.1, 0.07, 0.06, 0.05}},  // kurt
                                                          {{0, 0.8225, 0, 0}, {0.1, 0.07, 0, 0}},   // var_tanh
                                                          {{0, 3.29, 0, 0}, {0.1, 0.07, 0, 0}},     // var_sigmoid
                                                          {{0, 2.0, 0, 0}, {0.1, 0.07, 0, 0}}};     // var_laplace
  FspNorm n;
  n.targets = kPresets[static_cast<size_t>(preset)][0];
  n.weights = kPresets[static_cast<size_t>(preset)][1];
  return n;
}

FspNorm FspNorm::preset(const std::string& name) {
  return preset(choice_from_name<FspNormPreset>("fsp", "vector_norm", name));
}

int64_t FspOptions::codebook_size() const {
  int64_t k = 1;
  for (int64_t l : levels_) k *= l;
  return k;
}

void FspOptions::validate() const {
  check_fields("fsp", *this);
  LOCKSTEP_CHECK_ARG(!levels_.empty(), "fsp: levels must not be empty");
  double product = 1;
  for (int64_t l : levels_) {
    LOCKSTEP_CHECK_ARG(l >= 2 && l <= (int64_t{1} << 22), "fsp: every level must be in [2, 2^22], got ", l);
    product *= static_cast<double>(l);
  }
  LOCKSTEP_CHECK_ARG(product <= 2147483648.0, "fsp: the levels' product ", product, " exceeds 2^31 codes");
  LOCKSTEP_CHECK_ARG(dim() >= 1, "fsp: dim = ", dim(), " must be >= 1");
  for (double w : norm().weights) {
    LOCKSTEP_CHECK_ARG(std::isfinite(w) && w >= 0, "fsp: a vector_norm weight is ", w, ", it must be finite and >= 0");
  }
}

Fsp::Fsp(FspOptions options) : Quantizer("FSP"), options_(std::move(options)) {
  options_.validate();
  const int64_t cd = options_.codebook_dim();
  if (options_.dim() != cd) {  // the reference's order of draws: in, then out
    const bool bias = options_.projection_has_bias();
    project_in_ =
        register_module("project_in", torch::nn::Linear(torch::nn::LinearOptions(options_.dim(), cd).bias(bias)));
    project_out_ =
        register_module("project_out", torch::nn::Linear(torch::nn::LinearOptions(cd, options_.dim()).bias(bias)));
  }
  std::vector<int64_t> basis(static_cast<size_t>(cd), 1);
  for (size_t i = 1; i < basis.size(); ++i) basis[i] = basis[i - 1] * options_.levels()[i - 1];
  levels_ = register_buffer("_levels", torch::tensor(options_.levels(), torch::kInt64).to(torch::kFloat32));
  basis_ = register_buffer("_basis", torch::tensor(basis, torch::kInt64));
}

at::Tensor Fsp::latents(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == options_.dim(), "fsp: expected tokens (b, n, ", options_.dim(),
                     "), got ", x.sizes());
  const at::Tensor z = x.to(torch::kFloat32);
  return project_in_ ? project_in_->forward(z) : z;
}

at::Tensor fsp_activate(FspActivation activation, const at::Tensor& z) {
  switch (activation) {
    case FspActivation::Tanh:
      return (torch::tanh(z) + 1.0) / 2.0;
    case FspActivation::Sigmoid:
      return torch::sigmoid(z);
    case FspActivation::Normal:
      return (1.0 + torch::erf(z / kSqrt2)) / 2.0;
    case FspActivation::Laplace:
      return 0.5 * (1.0 + torch::sign(z) * (1.0 - torch::exp(-torch::abs(z))));
    case FspActivation::Cauchy:
      return torch::atan(z) / kPi + 0.5;
  }
  throw InvalidArgument("fsp: unknown activation");
}

at::Tensor fsp_invert(FspActivation activation, const at::Tensor& p) {
  switch (activation) {
    case FspActivation::Tanh:
      return torch::atanh(p * 2.0 - 1.0);
    case FspActivation::Sigmoid:
      return torch::logit(p);
    case FspActivation::Normal:
      return torch::erfinv(2.0 * p - 1.0) * kSqrt2;
    case FspActivation::Laplace:
      return -torch::sign(p - 0.5) * torch::log(1.0 - 2.0 * torch::abs(p - 0.5));
    case FspActivation::Cauchy:
      return torch::tan((p - 0.5) * kPi);
  }
  throw InvalidArgument("fsp: unknown activation");
}

namespace {
// The reference's forward default: float32's machine epsilon keeps an activation of exactly 1 in the last bin.
constexpr double kForwardEps = std::numeric_limits<float>::epsilon();

// `eps`, or InvalidArgument unless it lies in [0, 0.5) (beyond, the clamp [eps, 1 - eps] is empty).
double checked_eps(double eps) {
  LOCKSTEP_CHECK_ARG(eps >= 0 && eps < 0.5, "fsp: eps must lie in [0, 0.5), got ", eps);
  return eps;
}

// A call's clamp epsilon: the forward default unless given; 0 is the default there too (`eps or ...`).
double call_eps(const QuantizeContext& ctx) {
  const double eps = checked_eps(ctx.fsp_eps.value_or(0.0));
  return eps > 0 ? eps : kForwardEps;
}
}  // namespace

at::Tensor Fsp::bins(const at::Tensor& act, double eps) const {
  return (act.detach().clamp_max(1.0 - eps) * levels_).floor();
}

at::Tensor Fsp::value_of(const at::Tensor& act_of_bin) const {
  return (act_of_bin - 0.5) / kBinStd;  // variance 1 for uniformly used bins
}

std::pair<at::Tensor, at::Tensor> Fsp::draws(const at::Tensor& z, const QuantizeContext& ctx) const {
  const uint64_t perturb_key = draw_key(ctx);
  const uint64_t select_key = draw_key(ctx);
  const int64_t per_item = z.numel() / std::max<int64_t>(z.size(0), 1);
  const at::Tensor counters =
      torch::arange(z.numel(), z.options().dtype(torch::kInt64)).reshape(z.sizes()) + ctx.first_item * per_item;
  return {detail::hashed_uniform_torch(perturb_key, counters).to(z.scalar_type()),
          detail::hashed_uniform_torch(select_key, counters).to(z.scalar_type())};
}

at::Tensor fsp_norm_loss(const at::Tensor& sums, const FspNorm& norm, int64_t channels) {
  const at::Tensor count = sums.narrow(0, 0, 1).detach();
  const auto power_mean = [&](int64_t k) {
    return sums.narrow(0, 1 + (k - 1) * channels, channels) / count.clamp_min(1);
  };
  const at::Tensor e1 = power_mean(1), e2 = power_mean(2), e3 = power_mean(3), e4 = power_mean(4);
  const at::Tensor mean = e1;
  const at::Tensor central2 = (e2 - mean * mean).clamp_min(0);
  // Unbiased, as torch.var_mean; one token (or none) gives 0 where the reference divides by zero.
  const at::Tensor variance = central2 * count / (count - 1).clamp_min(1);
  const at::Tensor std = variance.sqrt().clamp_min(kStdFloor);
  const at::Tensor central3 = e3 - 3 * mean * e2 + 2 * mean.pow(3);
  const at::Tensor central4 = e4 - 4 * mean * e3 + 6 * mean.pow(2) * e2 - 3 * mean.pow(4);
  // Power sums cannot resolve the third and fourth moments of a channel whose spread is below 1e-3
  // of its mean (their rounding, ~1e-16 of mean^4, outgrows std^4): such a channel counts as constant
  // there, skewness 0 and kurtosis -3, as the reference's exactly constant channel.
  const at::Tensor resolved = central2 > mean.pow(2) * kConstantSpread;
  const at::Tensor skewness = torch::where(resolved, central3 / std.pow(3), torch::zeros_like(central3));
  const at::Tensor kurtosis = torch::where(resolved, central4 / std.pow(4), torch::zeros_like(central4)) - 3.0;
  const at::Tensor stats[4] = {mean, variance, skewness, kurtosis};
  at::Tensor loss = torch::zeros({}, sums.options());
  for (size_t k = 0; k < 4; ++k) {
    if (norm.weights[k] > 0) loss = loss + (stats[k] - norm.targets[k]).pow(2).mean() * norm.weights[k];
  }
  return loss;
}

QuantizerOutput Fsp::quantize(const at::Tensor& x, const QuantizeContext& ctx) {
  check_no_mask(ctx, "fsp");
  const double eps = call_eps(ctx);
  const at::Tensor z = latents(x);  // (b, n, cd)
  const int64_t cd = options_.codebook_dim();
  QuantizerOutput out;

  // The regulariser: power sums of the channels in float64, the global batch's in training.
  const FspNorm norm = options_.norm();
  if (!norm.any()) {
    out.losses["norm"] = z.sum() * 0;  // no weight: a zero that still carries the call's graph
  } else {
    const at::Tensor flat = z.reshape({-1, cd}).to(torch::kDouble);
    const at::Tensor packed = torch::cat({torch::full({1}, static_cast<double>(flat.size(0)), flat.options()),
                                          flat.sum(0), flat.pow(2).sum(0), flat.pow(3).sum(0), flat.pow(4).sum(0)});
    // By value: a distributed reducer calls it again in the backward, after this call has returned.
    const auto loss_of = [norm, cd](const at::Tensor& s) { return fsp_norm_loss(s, norm, cd); };
    LocalReducer local;
    Reducer* reducer = is_training() && ctx.reducer ? ctx.reducer : &local;
    out.losses["norm"] = reducer->apply_to_sum(packed, loss_of, LOCKSTEP_CALL_SITE("fsp.moments")).to(torch::kFloat32);
  }

  const at::Tensor act = fsp_activate(options_.activation(), z);
  const at::Tensor level = bins(act, eps);
  const at::Tensor midpoint = (level + 0.5) / levels_;
  at::Tensor act_out = act + (midpoint - act).detach();  // straight-through to the activation
  if (is_training() && options_.quantize_rate() < 1) {
    const auto [u_perturb, u_select] = draws(z, ctx);
    const at::Tensor proposal = act + (u_perturb * 2.0 - 1.0) / (levels_ * 2.0);
    const at::Tensor accepted = (proposal > 0) & (proposal < 1);
    const at::Tensor perturbed = torch::where(accepted, proposal, act);
    act_out = torch::where(u_select > options_.quantize_rate(), perturbed, act_out);
  }
  at::Tensor q;
  if (options_.need_inv_act()) {
    const at::Tensor inverted = fsp_invert(options_.activation(), act_out.clamp(eps, 1.0 - eps));
    q = z + (inverted - z).detach();  // straight-through to the latent
  } else {
    q = value_of(act_out);
  }
  out.indices = (level.to(torch::kInt64) * basis_).sum(-1);
  out.quantized = (project_out_ ? project_out_->forward(q) : q).to(x.scalar_type());
  return out;
}

at::Tensor Fsp::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  return (bins(fsp_activate(options_.activation(), latents(x)), kForwardEps).to(torch::kInt64) * basis_).sum(-1);
}

at::Tensor Fsp::level_indices(const at::Tensor& indices) const {
  return indices.to(torch::kInt64).unsqueeze(-1).div(basis_, "floor").remainder(levels_.to(torch::kInt64));
}

at::Tensor Fsp::decode(const at::Tensor& indices) { return decode_with(indices, 1e-6); }

at::Tensor Fsp::decode_with(const at::Tensor& indices, double eps) {
  checked_eps(eps);
  LOCKSTEP_CHECK_ARG(
      indices.numel() == 0 || (indices.min().item<int64_t>() >= 0 && indices.max().item<int64_t>() < codebook_size()),
      "fsp: indices must lie in [0, ", codebook_size(), ")");
  const at::Tensor act = (level_indices(indices).to(torch::kFloat32) + 0.5) / levels_;
  const at::Tensor q =
      options_.need_inv_act() ? fsp_invert(options_.activation(), act.clamp(eps, 1.0 - eps)) : value_of(act);
  return project_out_ ? project_out_->forward(q) : q;
}

FspDiagnostics Fsp::diagnostics(const at::Tensor& x, const QuantizeContext& ctx) {
  torch::NoGradGuard no_grad;
  const at::Tensor z = latents(x);
  const at::Tensor act = fsp_activate(options_.activation(), z);
  FspDiagnostics d;
  d.level_indices = bins(act, call_eps(ctx)).to(torch::kInt64);
  const at::Tensor flat = z.reshape({-1, options_.codebook_dim()});
  // As the reference's batch statistics (two passes, float32) of this holder's tokens.
  const auto [variance, mean] = torch::var_mean(flat, 0, /*unbiased=*/true);
  const at::Tensor scores = (flat - mean) / variance.sqrt().clamp_min(kStdFloor);
  d.mean = mean;
  d.variance = variance;
  d.skewness = scores.pow(3).mean(0);
  d.kurtosis = scores.pow(4).mean(0) - 3.0;
  if (is_training() && options_.quantize_rate() < 1) {
    const at::Tensor proposal = act + (draws(z, ctx).first * 2.0 - 1.0) / (levels_ * 2.0);
    d.accept_rate = ((proposal > 0) & (proposal < 1)).to(torch::kFloat32).mean();
  }
  return d;
}

}  // namespace lockstep::quant
