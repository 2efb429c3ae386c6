// The CUDA kernels of src/quant/cuda as torch calls (cuda_kernels.cpp). Internal to src/quant; not
// installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

#include "lockstep/quant/nearest_code.h"

namespace lockstep::quant::detail {

// The CUDA kernels of src/quant/cuda (cuda_kernels.cpp): whether this build compiled them (nvcc
// and a LibTorch with CUDA), and the searches and statistics they compute, for CUDA tensors. The
// public calls use them for CUDA tensors where built, the torch-op paths (torch_op_paths.h) elsewhere.
bool cuda_kernels_built();
NearestCode nearest_code_cuda(const at::Tensor& x, const at::Tensor& codebook, Metric metric);
at::Tensor code_scores_cuda(const at::Tensor& x, const at::Tensor& codebook, Metric metric);
at::Tensor squared_norms_cuda(const at::Tensor& x);  // |x|^2 per row, as nearest_code_cuda's score adds it
// smallest_first of CUDA values (n, m) of float32 or a narrower float type (not integers, which float32 may
// round), 1 <= k <= 32 (cuda/smallest_k.cu).
at::Tensor smallest_first_cuda(const at::Tensor& values, int64_t k);
std::vector<at::Tensor> code_counts_and_sums_cuda(const at::Tensor& tokens, const at::Tensor& indices, int64_t k);
// LFQ's codebook-entropy halves of float32 CUDA tokens x (len, bits) (lfq_entropy.cpp): {hi (len, 2^h),
// lo (len, 2^(bits - h))}, h = bits / 2; and their backward, dhi and dlo -> dL/dx (len, bits).
std::pair<at::Tensor, at::Tensor> lfq_halves_cuda(const at::Tensor& x, double z_scale);
at::Tensor lfq_halves_backward_cuda(const at::Tensor& x, double z_scale, const at::Tensor& dhi, const at::Tensor& dlo);
// LFQ's per-sample entropies of float32 CUDA tokens x (len, bits): each token's sum over its bits (len); and
// the gradient in x (len, bits) of their mean, given that mean's gradient (a CUDA scalar, not read on the host).
at::Tensor lfq_per_sample_cuda(const at::Tensor& x, double z_scale);
at::Tensor lfq_per_sample_backward_cuda(const at::Tensor& x, double z_scale, const at::Tensor& grad_mean);

}  // namespace lockstep::quant::detail
