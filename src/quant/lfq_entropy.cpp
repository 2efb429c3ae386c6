// LFQ's entropy terms without the reference's (n, K) matrices.
//
// Per-sample entropy. The logit of code c for token x is sum_j 2 * inv_t * x_j * c_j with
// c_j = +-a, so softmax over the 2^d codes is a product of independent bits with
// P(bit j) = sigmoid(z_j), z_j = 4 * inv_t * a * x_j, and H(p) = sum_j H_binary(z_j): O(n d).
// This is the exact entropy. The reference computes -sum_c p_c log(max(p_c, 1e-5)) instead; the
// two agree whenever every p_c >= 1e-5, and otherwise differ by
// sum_{c: p_c < 1e-5} p_c log(1e-5 / p_c) <= (number of such codes) * 1e-5 / e per token, which is
// non-zero only for codes whose probability is within a few orders of magnitude of 1e-5 (saturated
// codes contribute nothing to either form). We keep the exact value: the clamp is there to avoid
// log(0), which the factorised form never meets.
//
// Codebook entropy. H(mean_t p_t) needs the K-vector mean, which we accumulate over chunks of
// tokens; the backward recomputes each chunk's p and applies the softmax Jacobian:
// dL/dlogit_tc = p_tc (g_c - <p_t, g>), dL/dx_t = 2 inv_t sum_c dL/dlogit_tc c.
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/quant/lfq.h"

namespace lockstep::quant {
namespace {

// logit_weights: (d, K), the codes transposed times 2 * inv_temperature.
at::Tensor chunk_probs(const at::Tensor& x_chunk, const at::Tensor& logit_weights) {
  return torch::matmul(x_chunk, logit_weights).softmax(-1);
}

struct SumProbs : public torch::autograd::Function<SumProbs> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& codebook,
                            double inv_temperature, int64_t chunk_tokens) {
    ctx->save_for_backward({x, codebook});
    ctx->saved_data["inv_temperature"] = inv_temperature;
    ctx->saved_data["chunk_tokens"] = chunk_tokens;
    const at::Tensor logit_weights = codebook.t() * (2 * inv_temperature);
    at::Tensor total = torch::zeros({codebook.size(0)}, x.options());
    for (int64_t start = 0; start < x.size(0); start += chunk_tokens) {
      const int64_t len = std::min(chunk_tokens, x.size(0) - start);
      total += chunk_probs(x.narrow(0, start, len), logit_weights).sum(0);
    }
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& codebook = saved[1];
    const double inv_temperature = ctx->saved_data["inv_temperature"].toDouble();
    const int64_t chunk_tokens = ctx->saved_data["chunk_tokens"].toInt();
    const at::Tensor g = grad_outputs[0].to(x.scalar_type());  // (K,)
    const at::Tensor logit_weights = codebook.t() * (2 * inv_temperature);
    at::Tensor grad_x = torch::empty_like(x);
    for (int64_t start = 0; start < x.size(0); start += chunk_tokens) {
      const int64_t len = std::min(chunk_tokens, x.size(0) - start);
      const at::Tensor p = chunk_probs(x.narrow(0, start, len), logit_weights);  // (len, K)
      at::Tensor dlogits = g - torch::matmul(p, g).unsqueeze(1);
      dlogits.mul_(p);
      grad_x.narrow(0, start, len).copy_(torch::matmul(dlogits, logit_weights.t()));
    }
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor lfq_per_sample_entropy(const at::Tensor& x, double inv_temperature, double code_value) {
  if (x.size(0) == 0) return torch::zeros({}, x.options());
  // H_binary is even in z; in terms of |z| both terms are small and positive, so it stays exact
  // when bits saturate: H = softplus(-|z|) + |z| sigmoid(-|z|).
  const at::Tensor z = (x * (4 * inv_temperature * code_value)).abs();
  const at::Tensor h = torch::nn::functional::softplus(-z) + z * torch::sigmoid(-z);
  return h.sum(-1).mean();
}

at::Tensor lfq_sum_probs(const at::Tensor& x, const at::Tensor& codebook, double inv_temperature,
                         int64_t chunk_tokens) {
  LOCKSTEP_CHECK_ARG(x.dim() == 2 && codebook.dim() == 2 && x.size(1) == codebook.size(1),
                     "lfq: expected tokens (n, d) and codes (K, d), got ", x.sizes(), " and ", codebook.sizes());
  LOCKSTEP_CHECK_ARG(chunk_tokens >= 1, "lfq: chunk_tokens = ", chunk_tokens, " must be >= 1");
  return SumProbs::apply(x, codebook.to(x.scalar_type()), inv_temperature, chunk_tokens);
}

int64_t lfq_chunk_tokens(int64_t codebook_size, int64_t element_bytes, int64_t budget_bytes) {
  return std::max<int64_t>(1, budget_bytes / (codebook_size * element_bytes));
}

at::Tensor lfq_clamped_entropy(const at::Tensor& probs) {
  return -(probs * probs.clamp_min(1e-5).log()).sum(-1);
}

}  // namespace lockstep::quant
