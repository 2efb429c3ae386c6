// LFQ's entropy terms without the reference's (n, K) matrices.
//
// The logit of code c for token x is sum_j 2 * inv_t * x_j * c_j with c_j = +-a, so the softmax
// over the K = 2^d codes is a product of independent bits: p_t(c) = prod_j q_tj(c_j), with
// q_tj(+a) = sigmoid(z_tj), q_tj(-a) = sigmoid(-z_tj), z_tj = 4 * inv_t * a * x_tj. This is an
// identity, not an approximation: both forms agree up to floating-point rounding.
//
// Per-sample entropy. H(p_t) = sum_j H_binary(z_tj): O(n d). This is the exact entropy. The
// reference computes -sum_c p_c log(max(p_c, 1e-5)) instead; the two agree whenever every
// p_c >= 1e-5, and otherwise differ by sum_{c: p_c < 1e-5} p_c log(1e-5 / p_c) <= (number of such
// codes) * 1e-5 / e per token, which is non-zero only for codes whose probability is within a few
// orders of magnitude of 1e-5 (saturated codes contribute nothing to either form). We keep the
// exact value: the clamp is there to avoid log(0), which the factorised form never meets. On a CUDA
// device (float32) one kernel sums each token's bits and one runs the mean's backward (cuda/lfq.cu).
//
// Codebook entropy. H(mean_t p_t) needs the K-vector sum_t p_t. Split the d bits into the h most
// significant ("hi", the first h code dimensions) and the l = d - h others ("lo"). The index is
// hi * 2^l + lo, and p_t(hi, lo) = P_hi[t, hi] * P_lo[t, lo], where P_hi (n, 2^h) and P_lo (n, 2^l)
// are the products over each half's bits, built by h (resp. l) outer products with the per-bit
// pairs (sigmoid(-z), sigmoid(z)) in index order. Then sum_t p_t, viewed as (2^h, 2^l), is
// P_hi^T P_lo: one GEMM, O(n sqrt K) memory and O(n K) flops in a BLAS kernel instead of an
// (n, K) softmax. The backward of the GEMM is two more GEMMs (dP_hi = P_lo G^T, dP_lo = P_hi G),
// then a hand-written reverse pass through each token's outer products (O(sqrt K) per token, no
// division by probabilities that may underflow). Tokens go through in chunks that keep P_hi,
// P_lo and their gradients within a byte budget; the backward rebuilds each chunk's P_hi and P_lo
// (cheap next to the GEMMs) rather than keeping them, so memory stays bounded up to K = 2^24.
// On a CUDA device, float32, two kernels build each chunk's halves and run its reverse pass (cuda/lfq.cu,
// the per-entry arithmetic of lfq_halves.h); elsewhere off the CPU the halves come from torch operations
// (halves_from_ops) and each chunk's reverse pass from autograd on the rebuilt halves. All three take the
// same chunks, GEMMs and memory bound.
#include <ATen/Dispatch.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "cuda_kernels.h"
#include "lfq_internal.h"
#include "lockstep/core/error.h"
#include "lockstep/quant/lfq.h"

namespace lockstep::quant {
namespace {

// Elements held per token of a chunk: P_hi and P_lo, then their gradients in the backward.
int64_t elements_per_token(int64_t bits) {
  const int64_t h = bits / 2, l = bits - h;
  return 2 * ((int64_t{1} << h) + (int64_t{1} << l));
}

// One token's bits: q[2j] = P(bit j clear) = sigmoid(-z_j), q[2j + 1] = P(bit j set) = sigmoid(z_j).
// Both computed directly (not 1 - the other) to keep the relative precision of small values.
template <typename T>
void bit_pairs(const T* x, int64_t bits, T z_scale, T* q) {
  for (int64_t j = 0; j < bits; ++j) {
    const T z = x[j] * z_scale;
    q[2 * j] = T(1) / (T(1) + std::exp(z));
    q[2 * j + 1] = T(1) / (T(1) + std::exp(-z));
  }
}

// out (2^m) = outer product of the m pairs q, first pair most significant: out[2i + b] = prev[i] q_b.
// Expanded in place from the back, so each entry is read before it is overwritten.
template <typename T>
void expand(const T* q, int64_t m, T* out) {
  out[0] = T(1);
  for (int64_t k = 0, size = 1; k < m; ++k, size *= 2) {
    const T q0 = q[2 * k], q1 = q[2 * k + 1];
    for (int64_t i = size - 1; i >= 0; --i) {
      const T v = out[i];
      out[2 * i] = v * q0;
      out[2 * i + 1] = v * q1;
    }
  }
}

// Backward of expand: g = dL/dout (2^m, overwritten) -> dz (m) = dL/dz_j, through
// dq_j/dz_j = (-s sbar, s sbar). prefix: scratch of 2^m - 1, the products of the first k pairs.
template <typename T>
void expand_backward(const T* q, int64_t m, T* g, T* prefix, T* dz) {
  if (m == 0) return;
  prefix[0] = T(1);
  for (int64_t k = 1; k < m; ++k) {
    const int64_t half = int64_t{1} << (k - 1);
    const T* prev = prefix + half - 1;
    T* cur = prefix + 2 * half - 1;
    const T q0 = q[2 * (k - 1)], q1 = q[2 * (k - 1) + 1];
    for (int64_t i = 0; i < half; ++i) {
      cur[2 * i] = prev[i] * q0;
      cur[2 * i + 1] = prev[i] * q1;
    }
  }
  for (int64_t k = m; k >= 1; --k) {
    const int64_t half = int64_t{1} << (k - 1);
    const T* prev = prefix + half - 1;
    const T q0 = q[2 * (k - 1)], q1 = q[2 * (k - 1) + 1];
    T d0 = 0, d1 = 0;
    for (int64_t i = 0; i < half; ++i) {
      const T g0 = g[2 * i], g1 = g[2 * i + 1];
      d0 += g0 * prev[i];
      d1 += g1 * prev[i];
      g[i] = g0 * q0 + g1 * q1;  // i <= 2i: entries still to be read are never overwritten
    }
    dz[k - 1] = (d1 - d0) * q0 * q1;
  }
}

// x: (len, bits) contiguous -> hi (len, 2^h), lo (len, 2^l).
void build_halves(const at::Tensor& x, double z_scale, const at::Tensor& hi, const at::Tensor& lo) {
  const int64_t len = x.size(0), bits = x.size(1), h = bits / 2;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lfq_sum_probs", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* hp = hi.data_ptr<scalar_t>();
    scalar_t* lp = lo.data_ptr<scalar_t>();
    at::parallel_for(0, len, 64, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> q(2 * bits);
      for (int64_t t = begin; t < end; ++t) {
        bit_pairs(xp + t * bits, bits, static_cast<scalar_t>(z_scale), q.data());
        expand(q.data(), h, hp + (t << h));
        expand(q.data() + 2 * h, bits - h, lp + (t << (bits - h)));
      }
    });
  });
}

// dhi (len, 2^h), dlo (len, 2^l): dL/dP of each half, overwritten -> grad_x (len, bits).
void backward_halves(const at::Tensor& x, double z_scale, const at::Tensor& dhi, const at::Tensor& dlo,
                     const at::Tensor& grad_x) {
  const int64_t len = x.size(0), bits = x.size(1), h = bits / 2, l = bits - h;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lfq_sum_probs_backward", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* dhp = dhi.data_ptr<scalar_t>();
    scalar_t* dlp = dlo.data_ptr<scalar_t>();
    scalar_t* gp = grad_x.data_ptr<scalar_t>();
    const auto scale = static_cast<scalar_t>(z_scale);
    at::parallel_for(0, len, 64, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> q(2 * bits), prefix(int64_t{1} << l), dz(bits);
      for (int64_t t = begin; t < end; ++t) {
        bit_pairs(xp + t * bits, bits, scale, q.data());
        expand_backward(q.data(), h, dhp + (t << h), prefix.data(), dz.data());
        expand_backward(q.data() + 2 * h, l, dlp + (t << l), prefix.data(), dz.data() + h);
        for (int64_t j = 0; j < bits; ++j) gp[t * bits + j] = dz[j] * scale;
      }
    });
  });
}

// The same halves from torch operations, on x's device and differentiable: what runs off the CPU.
// x: (len, bits) -> {hi (len, 2^h), lo (len, 2^l)}.
std::pair<at::Tensor, at::Tensor> halves_from_ops(const at::Tensor& x, double z_scale) {
  const int64_t len = x.size(0), bits = x.size(1), h = bits / 2;
  const at::Tensor z = x * z_scale;
  const at::Tensor q0 = torch::sigmoid(-z), q1 = torch::sigmoid(z);  // each directly, as bit_pairs
  auto expand_ops = [&](int64_t first, int64_t m) {
    at::Tensor p = torch::ones({len, 1}, x.options());
    for (int64_t k = first; k < first + m; ++k) {  // out[2i + b] = prev[i] q_b
      p = torch::stack({p * q0.narrow(1, k, 1), p * q1.narrow(1, k, 1)}, 2).reshape({len, -1});
    }
    return p;
  };
  return {expand_ops(0, h), expand_ops(h, bits - h)};
}

// Where a chunk's halves are built and differentiated: the CPU's loops, the CUDA kernels, or torch operations.
enum class HalvesPath : int64_t { Cpu, Kernels, Ops };

HalvesPath halves_path(const at::Tensor& x) {
  if (x.device().is_cpu()) return HalvesPath::Cpu;
  const bool kernels = x.is_cuda() && x.scalar_type() == at::kFloat && detail::cuda_kernels_built();
  return kernels ? HalvesPath::Kernels : HalvesPath::Ops;
}

struct SumProbs : public torch::autograd::Function<SumProbs> {
  // x: (c, n, bits) -> (c, 2^h, 2^l), the sum over tokens of p_t per codebook, its halves built on `path`.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in, double z_scale,
                            int64_t chunk_tokens, int64_t path) {
    const at::Tensor x = x_in.contiguous();
    ctx->save_for_backward({x});
    ctx->saved_data["z_scale"] = z_scale;
    ctx->saved_data["chunk_tokens"] = chunk_tokens;
    ctx->saved_data["path"] = path;
    const int64_t bits = x.size(2), h = bits / 2, l = bits - h;
    at::Tensor total = torch::zeros({x.size(0), int64_t{1} << h, int64_t{1} << l}, x.options());
    for (int64_t start = 0; start < x.size(1); start += chunk_tokens) {
      const int64_t len = std::min(chunk_tokens, x.size(1) - start);
      const bool cpu = path == static_cast<int64_t>(HalvesPath::Cpu);  // the others make their own halves
      const at::Tensor hi = cpu ? torch::empty({len, int64_t{1} << h}, x.options()) : at::Tensor();
      const at::Tensor lo = cpu ? torch::empty({len, int64_t{1} << l}, x.options()) : at::Tensor();
      for (int64_t c = 0; c < x.size(0); ++c) {
        const at::Tensor xc = x[c].narrow(0, start, len);
        if (!cpu) {
          const auto [hi_off, lo_off] = path == static_cast<int64_t>(HalvesPath::Kernels)
                                            ? detail::lfq_halves_cuda(xc, z_scale)
                                            : halves_from_ops(xc, z_scale);
          total[c].addmm_(hi_off.t(), lo_off);
          continue;
        }
        build_halves(xc, z_scale, hi, lo);
        total[c].addmm_(hi.t(), lo);
      }
    }
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const double z_scale = ctx->saved_data["z_scale"].toDouble();
    const int64_t chunk_tokens = ctx->saved_data["chunk_tokens"].toInt();
    const at::Tensor g = grad_outputs[0].to(x.scalar_type()).contiguous();  // (c, 2^h, 2^l)
    const auto path = static_cast<HalvesPath>(ctx->saved_data["path"].toInt());
    if (path == HalvesPath::Ops) return {backward_from_ops(x, g, z_scale, chunk_tokens), {}, {}, {}};
    const int64_t bits = x.size(2), h = bits / 2, l = bits - h;
    at::Tensor grad_x = torch::empty_like(x);
    for (int64_t start = 0; start < x.size(1); start += chunk_tokens) {
      const int64_t len = std::min(chunk_tokens, x.size(1) - start);
      const bool cpu = path == HalvesPath::Cpu;
      const at::Tensor hi = cpu ? torch::empty({len, int64_t{1} << h}, x.options()) : at::Tensor();
      const at::Tensor lo = cpu ? torch::empty({len, int64_t{1} << l}, x.options()) : at::Tensor();
      for (int64_t c = 0; c < x.size(0); ++c) {
        const at::Tensor xc = x[c].narrow(0, start, len);
        if (!cpu) {
          const auto [hi_k, lo_k] = detail::lfq_halves_cuda(xc, z_scale);
          const at::Tensor dhi = torch::mm(lo_k, g[c].t()), dlo = torch::mm(hi_k, g[c]);
          grad_x[c].narrow(0, start, len).copy_(detail::lfq_halves_backward_cuda(xc, z_scale, dhi, dlo));
          continue;
        }
        build_halves(xc, z_scale, hi, lo);
        // The GEMM's backward: dP_hi = P_lo G^T, dP_lo = P_hi G.
        const at::Tensor dhi = torch::mm(lo, g[c].t()), dlo = torch::mm(hi, g[c]);
        backward_halves(xc, z_scale, dhi, dlo, grad_x[c].narrow(0, start, len));
      }
    }
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor()};
  }

  // Each chunk's halves rebuilt with autograd on, then the GEMM's backward pulled through them.
  static at::Tensor backward_from_ops(const at::Tensor& x, const at::Tensor& g, double z_scale, int64_t chunk_tokens) {
    at::Tensor grad_x = torch::empty_like(x);
    at::AutoGradMode grad_on(true);
    for (int64_t start = 0; start < x.size(1); start += chunk_tokens) {
      const int64_t len = std::min(chunk_tokens, x.size(1) - start);
      for (int64_t c = 0; c < x.size(0); ++c) {
        const at::Tensor xc = x[c].narrow(0, start, len).detach().requires_grad_();
        const auto [hi, lo] = halves_from_ops(xc, z_scale);
        // With one bit the high half is empty (a column of ones): nothing flows through it.
        std::vector<at::Tensor> outputs{lo}, grads{torch::mm(hi.detach(), g[c])};
        if (hi.requires_grad()) {
          outputs.push_back(hi);
          grads.push_back(torch::mm(lo.detach(), g[c].t()));
        }
        grad_x[c].narrow(0, start, len).copy_(torch::autograd::grad(outputs, {xc}, grads)[0]);
      }
    }
    return grad_x;
  }
};

}  // namespace

namespace {
// The per-sample entropy of float32 CUDA tokens by two kernels (cuda/lfq.cu): each token's sum, then the
// backward of their mean in one pass, instead of a dozen elementwise operations and their autograd nodes.
struct PerSampleEntropy : torch::autograd::Function<PerSampleEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double z_scale) {
    ctx->save_for_backward({x});
    ctx->saved_data["z_scale"] = z_scale;
    return detail::lfq_per_sample_cuda(x, z_scale).mean();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {detail::lfq_per_sample_backward_cuda(x, ctx->saved_data["z_scale"].toDouble(), grad[0]), {}};
  }
};
}  // namespace

at::Tensor lfq_per_sample_entropy(const at::Tensor& x, double inv_temperature, double code_value) {
  if (x.size(0) == 0) return torch::zeros({}, x.options());
  if (x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() == 2 && detail::cuda_kernels_built()) {
    return PerSampleEntropy::apply(x, 4 * inv_temperature * code_value);
  }
  return detail::lfq_per_sample_entropy_ops(x, inv_temperature, code_value);
}

namespace detail {
at::Tensor lfq_per_sample_entropy_ops(const at::Tensor& x, double inv_temperature, double code_value) {
  if (x.size(0) == 0) return torch::zeros({}, x.options());
  // H_binary is even in z; in terms of |z| both terms are small and positive, so it stays exact
  // when bits saturate: H = softplus(-|z|) + |z| sigmoid(-|z|).
  const at::Tensor z = (x * (4 * inv_temperature * code_value)).abs();
  const at::Tensor h = torch::nn::functional::softplus(-z) + z * torch::sigmoid(-z);
  return h.sum(-1).mean();
}
}  // namespace detail

namespace {
at::Tensor sum_probs(const at::Tensor& x, double inv_temperature, double code_value, int64_t budget_bytes,
                     HalvesPath path) {
  LOCKSTEP_CHECK_ARG((x.dim() == 2 || x.dim() == 3) && x.size(-1) >= 1 && x.size(-1) <= 24,
                     "lfq: expected tokens (n, bits) or (codebooks, n, bits) with 1 <= bits <= 24, got ", x.sizes());
  LOCKSTEP_CHECK_ARG(budget_bytes >= 1, "lfq: budget_bytes = ", budget_bytes, " must be >= 1");
  const at::Tensor x3 = x.dim() == 2 ? x.unsqueeze(0) : x;
  const int64_t bits = x3.size(2), groups = x3.size(0);
  // Codebooks go one after the other through the same chunk buffers.
  const int64_t chunk = lfq_chunk_tokens(bits, static_cast<int64_t>(x3.element_size()), budget_bytes);
  const at::Tensor sum =
      SumProbs::apply(x3, 4 * inv_temperature * code_value, chunk, static_cast<int64_t>(path)).reshape({groups, -1});
  return x.dim() == 2 ? sum.squeeze(0) : sum;
}
}  // namespace

at::Tensor lfq_sum_probs(const at::Tensor& x, double inv_temperature, double code_value, int64_t budget_bytes) {
  return sum_probs(x, inv_temperature, code_value, budget_bytes, halves_path(x));
}

namespace detail {
at::Tensor lfq_sum_probs_ops(const at::Tensor& x, double inv_temperature, double code_value, int64_t budget_bytes) {
  return sum_probs(x, inv_temperature, code_value, budget_bytes, HalvesPath::Ops);
}
}  // namespace detail

int64_t lfq_chunk_tokens(int64_t bits, int64_t element_bytes, int64_t budget_bytes) {
  return std::max<int64_t>(1, budget_bytes / (elements_per_token(bits) * element_bytes));
}

at::Tensor lfq_clamped_entropy(const at::Tensor& probs) { return -(probs * probs.clamp_min(1e-5).log()).sum(-1); }

}  // namespace lockstep::quant
