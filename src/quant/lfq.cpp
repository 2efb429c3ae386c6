#include "lockstep/quant/lfq.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>
#include <string>

#include "lfq_internal.h"
#include "lockstep/core/error.h"
#include "lockstep/core/memory.h"
#include "lockstep/core/random.h"

namespace lockstep::quant {
namespace {

at::Tensor l2_normalize(const at::Tensor& t) {
  return torch::nn::functional::normalize(t, torch::nn::functional::NormalizeFuncOptions().dim(-1));
}

// LFQ computes in float32 (the reference's force_quantization_f32), or double when given double.
at::ScalarType compute_type(const at::Tensor& x) {
  return x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat32;
}

// The call's inverse temperature (the reference's forward argument), else the option's.
double call_inv_temperature(const LfqOptions& options, const QuantizeContext& ctx) {
  const double inv_t = ctx.inv_temperature.value_or(options.inv_temperature());
  LOCKSTEP_CHECK_ARG(inv_t > 0 && std::isfinite(inv_t), "lfq: inv_temperature = ", inv_t, " must be > 0");
  return inv_t;
}

}  // namespace

void LfqOptions::validate() const {
  check_fields("lfq", *this);
  const int64_t k = codebook_size_;
  LOCKSTEP_CHECK_ARG(k >= 2 && k <= (int64_t{1} << 24) && (k & (k - 1)) == 0, "lfq: codebook_size = ", k,
                     " must be a power of two in [2, 2^24]");
  LOCKSTEP_CHECK_ARG(!dim_ || *dim_ >= 1, "lfq: dim = ", dim_.value_or(0), " must be >= 1");
}

namespace detail {
// vector-quantize-pytorch's CosineSimLinear: the unit input times the unit columns of `weight` (in, out), times scale.
struct CosineSimLinearImpl : torch::nn::Module {
  CosineSimLinearImpl(int64_t in, int64_t out, double scale)
      : weight(register_parameter("weight", torch::randn({in, out}))), scale(scale) {}
  at::Tensor forward(const at::Tensor& x) const {
    namespace F = torch::nn::functional;
    return torch::matmul(F::normalize(x, F::NormalizeFuncOptions().dim(-1)),
                         F::normalize(weight, F::NormalizeFuncOptions().dim(0))) *
           scale;
  }
  at::Tensor weight;
  double scale;
};
}  // namespace detail

double detail::lfq_training_bytes(int64_t codebooks, int64_t codes) {
  // A training call holds several (codebooks, K) float tensors at once: the summed probabilities, the
  // packed statistics, the average, the entropy's temporaries and their gradients. Measured peak
  // growth of a forward and backward: 6.2-6.3 times one such tensor (c 8 and 16, K 2^20); 7 with margin.
  return 7.0 * 4 * static_cast<double>(codebooks) * static_cast<double>(codes);
}

Lfq::Lfq(LfqOptions options) : Quantizer("Lfq"), options_(std::move(options)) {
  options_.validate();
  bits_ = 0;
  while ((int64_t{1} << bits_) < options_.codebook_size()) ++bits_;
  const int64_t code_dim = options_.num_codebooks() * bits_;
  check_fits_in_memory(detail::lfq_training_bytes(options_.num_codebooks(), options_.codebook_size()),
                       ::lockstep::detail::concat("lfq: the code distribution of ", options_.num_codebooks(),
                                                  " codebook(s) of ", options_.codebook_size(), " codes"));
  dim_ = options_.dim().value_or(code_dim);
  if (dim_ != code_dim || options_.force_projections()) {
    const bool bias = options_.projection_has_bias();
    if (options_.cosine_sim_project_in() > 0) {
      cosine_project_in_ = register_module("project_in", std::make_shared<detail::CosineSimLinearImpl>(
                                                             dim_, code_dim, options_.cosine_sim_project_in()));
    } else {
      project_in_ =
          register_module("project_in", torch::nn::Linear(torch::nn::LinearOptions(dim_, code_dim).bias(bias)));
    }
    project_out_ =
        register_module("project_out", torch::nn::Linear(torch::nn::LinearOptions(code_dim, dim_).bias(bias)));
  }
  if (options_.orthogonal_rotation()) {
    rotation_ = register_buffer("orthogonal_rot", torch::nn::init::orthogonal_(torch::empty({bits_, bits_})));
  }
}

at::Tensor Lfq::quantize_codes(const at::Tensor& z) const {
  const double scale = options_.codebook_scale();
  const at::Tensor q = torch::where(z > 0, torch::full_like(z, scale), torch::full_like(z, -scale));
  return options_.spherical() ? l2_normalize(q) * scale : q;
}

at::Tensor Lfq::codes_to_indices(const at::Tensor& codes) const {
  // First code dimension is the most significant bit, as the reference's mask 2^(d-1) ... 1.
  const at::Tensor mask = torch::pow(2, torch::arange(bits_ - 1, -1, -1, codes.options().dtype(torch::kInt64)));
  return ((codes > 0).to(torch::kInt64) * mask).sum(-1);
}

at::Tensor Lfq::indices_to_codes(const at::Tensor& indices) const {
  const at::Tensor shifts = torch::arange(bits_ - 1, -1, -1, indices.options().dtype(torch::kInt64));
  const at::Tensor bit = indices.unsqueeze(-1).__rshift__(shifts).bitwise_and(1).to(torch::kFloat32);
  const double scale = options_.codebook_scale();
  const at::Tensor codes = bit * (2 * scale) - scale;
  return options_.spherical() ? l2_normalize(codes) * scale : codes;
}

at::Tensor Lfq::to_code_space(const at::Tensor& x) {
  LOCKSTEP_CHECK_ARG(x.dim() == 3 && x.size(2) == dim_, "lfq: expected tokens (b, n, ", dim_, "), got ", x.sizes());
  at::Tensor z = (project_in_          ? project_in_->forward(x)
                  : cosine_project_in_ ? cosine_project_in_->forward(x)
                                       : x)
                     .to(compute_type(x));
  if (options_.soft_clamp() > 0) z = (z / options_.soft_clamp()).tanh() * options_.soft_clamp();
  z = z.reshape({x.size(0), x.size(1), options_.num_codebooks(), bits_});
  if (rotation_.defined()) z = torch::matmul(z, rotation_.to(z.scalar_type()));
  return options_.spherical() ? l2_normalize(z) * options_.codebook_scale() : z;
}

at::Tensor Lfq::from_code_space(const at::Tensor& codes) {
  const at::Tensor turned = rotation_.defined() ? torch::matmul(codes, rotation_.t().to(codes.scalar_type())) : codes;
  const at::Tensor flat = turned.flatten(-2);
  if (!project_out_) return flat;
  return project_out_->forward(flat.to(project_out_->weight.scalar_type()));
}

QuantizerOutput Lfq::quantize(const at::Tensor& x, const QuantizeContext& ctx) {
  // Padding is quantized as any token (as the reference's LFQ) but kept out of the entropy and the
  // commitment loss.
  const at::Tensor mask = checked_mask(ctx, x, "lfq");
  const at::Tensor z = to_code_space(x);  // (b, n, c, bits)
  const at::Tensor q = quantize_codes(z.detach());
  const int64_t c = options_.num_codebooks();
  QuantizerOutput out;
  out.indices = c == 1 ? codes_to_indices(q).squeeze(-1) : codes_to_indices(q);
  if (!is_training()) {
    out.quantized = from_code_space(q).to(x.scalar_type());
    return out;
  }
  out.quantized = from_code_space(z + (q - z).detach()).to(x.scalar_type());

  const at::Tensor tokens = entropy_tokens(z, mask, ctx);  // (N, c, bits)
  const double code_value = this->code_value();
  const double inv_t = call_inv_temperature(options_, ctx);
  // Everything the entropy loss needs is a sum over the chosen tokens of the global batch: their
  // count, their per-sample entropies (the reference's mean over (N, c)) and their code probabilities.
  const at::Tensor per_sample = tokens.size(0) > 0
                                    ? lfq_per_sample_entropy(tokens.reshape({-1, bits_}), inv_t, code_value)
                                    : torch::zeros({}, tokens.options());
  const auto chosen = static_cast<double>(tokens.size(0));
  const at::Tensor local_sum = lfq_sum_probs(tokens.transpose(0, 1), inv_t, code_value);  // (c, K)
  const at::Tensor packed =
      torch::cat({torch::full({1}, chosen, tokens.options()),
                  (per_sample * (chosen * static_cast<double>(c))).reshape({1}), local_sum.reshape(-1)});
  const int64_t k = codebook_size();
  const double gamma = options_.diversity_gamma();
  // aux = per-sample entropy - gamma * codebook entropy, of the global sums `s`.
  const bool softplus = options_.softplus_entropy();
  const double offset = options_.entropy_loss_offset();
  const auto aux_of = [c, k, gamma, softplus, offset](const at::Tensor& s) {
    const at::Tensor count = s.narrow(0, 0, 1).detach().clamp_min(1);
    const at::Tensor per_sample_mean = (s.narrow(0, 1, 1) / (count * static_cast<double>(c))).squeeze(0);
    const at::Tensor avg_probs = s.narrow(0, 2, c * k).reshape({c, k}) / count;
    const at::Tensor aux = per_sample_mean - gamma * lfq_clamped_entropy(avg_probs).mean();
    return softplus ? torch::softplus(aux + offset) : aux;  // the reference's experimental softplus
  };
  LocalReducer local;
  Reducer* reducer = ctx.reducer ? ctx.reducer : &local;
  // One reduction over everyone holding the batch, whatever the data.
  const at::Tensor aux = reducer->apply_to_sum(packed, aux_of, LOCKSTEP_CALL_SITE("lfq.avg_probs"));
  out.losses["entropy"] = aux * options_.entropy_loss_weight();
  if (options_.commitment_loss_weight() > 0) {
    out.losses["commitment"] = commitment_of(z, q, mask) * options_.commitment_loss_weight();
  }
  return out;
}

at::Tensor Lfq::entropy_tokens(const at::Tensor& z, const at::Tensor& mask, const QuantizeContext& ctx) const {
  const int64_t c = options_.num_codebooks();
  const at::Tensor tokens = z.reshape({-1, c, bits_});  // (N, c, bits)
  if (options_.frac_per_sample_entropy() >= 1) {
    return mask.defined() ? tokens.index_select(0, mask.reshape(-1).nonzero().squeeze(1)) : tokens;
  }
  return tokens.index_select(0, entropy_positions(z, mask, ctx).to(tokens.device()));
}

at::Tensor Lfq::entropy_subset(const at::Tensor& x, const QuantizeContext& ctx) {
  torch::NoGradGuard no_grad;
  const at::Tensor mask = checked_mask(ctx, x, "lfq");
  const at::Tensor z = to_code_space(x);
  at::Tensor subset = torch::zeros({x.size(0) * x.size(1)}, torch::kBool);
  if (options_.frac_per_sample_entropy() >= 1) {
    return mask.defined() ? mask.to(at::kCPU) : torch::ones({x.size(0), x.size(1)}, torch::kBool);
  }
  subset.index_fill_(0, entropy_positions(z, mask, ctx), true);
  return subset.reshape({x.size(0), x.size(1)});
}

at::Tensor Lfq::entropy_positions(const at::Tensor& z, const at::Tensor& mask, const QuantizeContext& ctx) const {
  const int64_t local_tokens = z.numel() == 0 ? 0 : z.size(0) * z.size(1);
  // Each token joins the entropy subset with probability frac, decided by a hash of its global
  // position: W ranks choose exactly the tokens one process holding the batch would. (The
  // reference takes exactly int(N * frac) tokens at random; the count here is binomial.)
  at::Generator gen = ctx.generator.defined() ? ctx.generator : at::detail::getDefaultCPUGenerator();
  uint64_t key = 0;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    key = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
  }
  const int64_t batch = z.size(0);
  const int64_t first_token = batch > 0 ? ctx.first_item * (local_tokens / batch) : 0;
  const auto frac = static_cast<float>(options_.frac_per_sample_entropy());
  std::vector<int64_t> chosen;
  const at::Tensor counted = mask.defined() ? mask.reshape(-1).to(at::kCPU).contiguous() : at::Tensor();
  const bool* counts = counted.defined() ? counted.data_ptr<bool>() : nullptr;
  for (int64_t t = 0; t < local_tokens; ++t) {
    if ((!counts || counts[t]) && hashed_uniform(key, static_cast<uint64_t>(first_token + t)) < frac) {
      chosen.push_back(t);
    }
  }
  return torch::tensor(chosen, torch::kInt64);
}

at::Tensor Lfq::commitment_of(const at::Tensor& z, const at::Tensor& q, const at::Tensor& mask) {
  const at::Tensor counted_z = mask.defined() ? z.index({mask}) : z;
  const at::Tensor counted_q = mask.defined() ? q.index({mask}) : q;
  // No counted token: 0, still carrying z's graph (a loss with a gradient function, as any other call's).
  return counted_z.numel() == 0 ? z.sum() * 0 : torch::mse_loss(counted_z, counted_q.detach());
}

double Lfq::code_value() const {
  return options_.spherical() ? options_.codebook_scale() / std::sqrt(static_cast<double>(bits_))
                              : options_.codebook_scale();
}

LfqLossTerms Lfq::loss_terms(const at::Tensor& x, const QuantizeContext& ctx) {
  const at::Tensor mask = checked_mask(ctx, x, "lfq");
  const at::Tensor z = to_code_space(x);
  if (!is_training()) {
    const at::Tensor zero = torch::zeros({}, z.options());
    return {zero, zero, zero};
  }
  const at::Tensor tokens = entropy_tokens(z, mask, ctx);  // (N, c, bits)
  const double inv_t = call_inv_temperature(options_, ctx);
  LfqLossTerms terms;
  if (tokens.size(0) == 0) {  // nothing counted: zeros, carrying z's graph
    terms.per_sample_entropy = terms.codebook_entropy = z.sum() * 0;
  } else {
    terms.per_sample_entropy = lfq_per_sample_entropy(tokens.reshape({-1, bits_}), inv_t, code_value());
    const at::Tensor avg_probs =
        lfq_sum_probs(tokens.transpose(0, 1), inv_t, code_value()) / static_cast<double>(tokens.size(0));  // (c, K)
    terms.codebook_entropy = lfq_clamped_entropy(avg_probs).mean();
  }
  terms.commitment = options_.commitment_loss_weight() > 0 ? commitment_of(z, quantize_codes(z.detach()), mask)
                                                           : torch::zeros({}, z.options());
  return terms;
}

at::Tensor Lfq::encode(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  const at::Tensor indices = codes_to_indices(to_code_space(x));  // (b, n, c)
  return options_.num_codebooks() == 1 ? indices.squeeze(-1) : indices;
}

at::Tensor Lfq::decode(const at::Tensor& indices) {
  const int64_t c = options_.num_codebooks();
  LOCKSTEP_CHECK_ARG(c == 1 ? indices.dim() == 2 : (indices.dim() == 3 && indices.size(2) == c),
                     "lfq: expected indices (b, n", c == 1 ? "" : ", " + std::to_string(c), "), got ", indices.sizes());
  LOCKSTEP_CHECK_ARG(
      indices.numel() == 0 || (indices.min().item<int64_t>() >= 0 && indices.max().item<int64_t>() < codebook_size()),
      "lfq: indices must lie in [0, ", codebook_size(), ")");
  const at::Tensor grouped = c == 1 ? indices.unsqueeze(-1) : indices;
  return from_code_space(indices_to_codes(grouped));
}

}  // namespace lockstep::quant
