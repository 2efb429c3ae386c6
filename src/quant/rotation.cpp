// The rotation trick (Fifty et al. 2024) as one pass over the rows, forward and backward: the
// torch-op form costs ~20 passes over (n, d) tensors, most of a VQ step beside the search.
// Per row, with the reference's clamps (F.normalize, eps 1e-6):
//   u = x / max(|x|, eps), q^ = q / max(|q|, eps), w = (u + q^) / max(|u + q^|, eps), s = |q| / max(|x|, eps)
//   out = s (x - 2 (x.w) w + 2 (x.u) q^)        (= q for x != 0)
//   dL/dx = s (g - 2 (g.w) w + 2 (g.q^) u)      (u, q^, w, s held constant, as the reference detaches them)
// A token with |x| < eps has no direction to rotate: its output is q and its gradient passes straight
// through (the reference's clamps give 0 there, which is no code, so decode(encode(x)) would differ).
#include <ATen/Parallel.h>

#include <torch/torch.h>

#include <cmath>

#include "lockstep/core/error.h"
#include "lockstep/quant/vq.h"
#include "torch_op_paths.h"

namespace lockstep::quant {
namespace {

constexpr float kEps = 1e-6f;
constexpr int64_t kGrainRows = 512;

struct RowFrame {
  float inv_x, inv_q, inv_t, scale;
  bool degenerate;  // |x| < eps: out = q, gradient straight through
};

inline RowFrame frame_of(const float* x, const float* q, int64_t d) {
  float xx = 0, qq = 0;
#pragma omp simd reduction(+ : xx, qq)
  for (int64_t j = 0; j < d; ++j) {
    xx += x[j] * x[j];
    qq += q[j] * q[j];
  }
  RowFrame f;
  const float norm_x = std::sqrt(xx), norm_q = std::sqrt(qq);
  f.inv_x = 1.0f / std::max(norm_x, kEps);
  f.inv_q = 1.0f / std::max(norm_q, kEps);
  float tt = 0;
#pragma omp simd reduction(+ : tt)
  for (int64_t j = 0; j < d; ++j) {
    const float t = x[j] * f.inv_x + q[j] * f.inv_q;
    tt += t * t;
  }
  f.inv_t = 1.0f / std::max(std::sqrt(tt), kEps);
  f.scale = norm_q * f.inv_x;
  f.degenerate = norm_x < kEps;
  return f;
}

// out = s (v - 2 (v.w) w + 2 (v.a) b): forward with v = x, (a, b) = (u, q^); backward with v = g,
// (a, b) = (q^, u).
inline void reflect_row(const float* v, const float* x, const float* q, const RowFrame& f, bool forward, int64_t d,
                        float* out) {
  if (f.degenerate) {
    for (int64_t j = 0; j < d; ++j) out[j] = forward ? q[j] : v[j];
    return;
  }
  float vw = 0, va = 0;
#pragma omp simd reduction(+ : vw, va)
  for (int64_t j = 0; j < d; ++j) {
    const float u = x[j] * f.inv_x, qh = q[j] * f.inv_q;
    vw += v[j] * (u + qh) * f.inv_t;
    va += v[j] * (forward ? u : qh);
  }
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) {
    const float u = x[j] * f.inv_x, qh = q[j] * f.inv_q;
    const float w = (u + qh) * f.inv_t;
    out[j] = f.scale * (v[j] - 2 * vw * w + 2 * va * (forward ? qh : u));
  }
}

// Applies reflect_row to every row of v (n, d) for tokens x and codes q, all contiguous float.
at::Tensor reflect_rows(const at::Tensor& v, const at::Tensor& x, const at::Tensor& q, bool forward) {
  at::Tensor out = torch::empty_like(x);
  const int64_t n = x.size(0), d = x.size(1);
  const float* vp = v.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const RowFrame f = frame_of(xp + i * d, qp + i * d, d);
      reflect_row(vp + i * d, xp + i * d, qp + i * d, f, forward, d, op + i * d);
    }
  });
  return out;
}

struct RotateTo : public torch::autograd::Function<RotateTo> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& q) {
    ctx->save_for_backward({x, q});
    return reflect_rows(x, x, q, true);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor g = grad_outputs[0].to(torch::kFloat32).contiguous();
    return {reflect_rows(g, saved[0], saved[1], false), at::Tensor()};
  }
};

}  // namespace

namespace detail {
// The definition from torch operations, on x's device; autograd derives the same backward, since
// everything but x is detached.
at::Tensor rotate_to_torch(const at::Tensor& x, const at::Tensor& q) {
  auto clamped_norm = [](const at::Tensor& t) { return t.norm(2, -1, true).clamp_min(kEps); };
  const at::Tensor xf = x.to(torch::kFloat32), qf = q.detach().to(torch::kFloat32), xd = xf.detach();
  const at::Tensor u = xd / clamped_norm(xd), q_hat = qf / clamped_norm(qf);
  const at::Tensor w = (u + q_hat) / clamped_norm(u + q_hat);
  const at::Tensor scale = qf.norm(2, -1, true) / clamped_norm(xd);
  const at::Tensor rotated = scale * (xf - 2 * (xf * w).sum(-1, true) * w + 2 * (xf * u).sum(-1, true) * q_hat);
  return torch::where(xd.norm(2, -1, true) < kEps, qf + (xf - xd), rotated);  // |x| < eps: q, straight through
}
}  // namespace detail

at::Tensor rotate_to(const at::Tensor& x, const at::Tensor& q) {
  LOCKSTEP_CHECK_ARG(x.dim() == 2 && x.sizes() == q.sizes(), "rotate_to: expected x and q of one shape (n, d), got ",
                     x.sizes(), " and ", q.sizes());
  if (!x.device().is_cpu()) return detail::rotate_to_torch(x, q);
  const at::Tensor xf = x.to(torch::kFloat32).contiguous();
  const at::Tensor qf = q.detach().to(torch::kFloat32).contiguous();
  return RotateTo::apply(xf, qf);
}

}  // namespace lockstep::quant
