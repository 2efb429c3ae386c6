// Helpers vq.cpp shares with vq_implicit.cpp (and nothing else): not part of the public interface.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "lockstep/quant/vq.h"

namespace lockstep::quant::vq_detail {

// The reference's l2norm (F.normalize with eps 1e-6).
at::Tensor l2norm(const at::Tensor& t);
// `g`, or torch's default CPU generator when undefined.
at::Generator or_default(const at::Generator& g);
// The hashed uniform of (token, code) for tokens first..first+len-1 and codes 0..k-1, counter
// token * k + code: on the host for CPU tensors, from torch operations on other devices.
at::Tensor uniforms(uint64_t key, int64_t first, int64_t len, int64_t k, const at::TensorOptions& on);
// An evaluation call's output: the codes q exactly (the reference's x + (q - x) rounds), with the
// straight-through gradient to the tokens t where they take one (t - t is exactly 0).
at::Tensor codes_with_token_gradient(const at::Tensor& t, const at::Tensor& q);
// A top-k call's padding (`mask` (b, n) false; undefined: none): output 0, indices -1, code losses and
// distances 0.
void mask_topk(const at::Tensor& mask, VqTopk& result);
// VqTopk::distance from a search's score of each code: Euclidean the squared distance, cosine the
// similarity x.e, turned to the squared distance between unit vectors (2 - 2 x.e); over cd, as code_loss.
// Monotone in the score, so it keeps the search's order.
at::Tensor ranked_distance(const at::Tensor& score, Metric metric, int64_t cd);

}  // namespace lockstep::quant::vq_detail
