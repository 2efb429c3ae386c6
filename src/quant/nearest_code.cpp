#include "lockstep/quant/nearest_code.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "lockstep/core/error.h"
#include "quant_paths.h"

// A fused search, no BLAS: a register-blocked kernel computes R tokens x NB codes of
// bias + x.(scale e) over the whole of d in vector registers, and folds them at once into a running
// minimum kept per lane (value and code block), so neither the n x k matrix nor a tile of it is ever
// stored. With the codes packed once per call (pre-scaled, NB codes interleaved per d step), the
// inner loop is one broadcast load of x and NB / lanes fused multiply-adds per token, as in a sgemm
// micro-kernel.
//
// Measured at n 16384, k 512, d 64, one thread, on the AVX-512 Xeon we use (thread CPU time, square
// sgemm 2048 ~150 GFLOP/s): this runs ~8.3-8.6 ms (~125 GFLOP/s, ~80% of square sgemm). The previous
// version (1024 x 256 tiles through at::mm_out, then a bias + argmin pass) took ~15 ms, of which the
// OpenBLAS products alone were ~8.4 ms (oneDNN's dnnl_sgemm: ~7.3 ms on the same tiles): the separate
// pass over the tile cost as much as the product, and a product of any BLAS plus a pass cannot beat
// the fused kernel.
//
// Kernels are written once with GCC vector extensions (GCC and Clang, any target) and compiled per
// instruction set with target attributes; the best one the CPU supports is picked at run time. Vector
// code is contracted to fused multiply-adds (GCC's C++ default, -ffp-contract=fast).
namespace lockstep::quant {
namespace {

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define LOCKSTEP_NC_X86 1
#endif
#define LOCKSTEP_NC_INLINE __attribute__((always_inline)) inline

typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));
#ifdef LOCKSTEP_NC_X86
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
#endif

// The packed codebook: block b holds codes [b NB, (b + 1) NB), as d rows of NB floats (code j of the
// block at lane j), each scaled by `scale`; bias holds NB floats per block. Lanes past k have
// zero codes and bias +inf, so they never win.
struct Packed {
  std::vector<float> codes;
  std::vector<float> bias;
  int64_t blocks = 0;
};

Packed pack(const float* codebook, int64_t k, int64_t d, int64_t nb, bool euclid) {
  Packed p;
  p.blocks = (k + nb - 1) / nb;
  p.codes.assign(static_cast<size_t>(p.blocks * nb * d), 0.0f);
  p.bias.assign(static_cast<size_t>(p.blocks * nb), std::numeric_limits<float>::infinity());
  // Euclidean: minimise |e|^2 - 2 x.e (|x|^2 is constant per row); Cosine: minimise -x.e. Scaling
  // by -2 or -1 is exact, so equal codes give equal values (ties keep the lowest index).
  const float scale = euclid ? -2.0f : -1.0f;
  for (int64_t j = 0; j < k; ++j) {
    const float* e = codebook + j * d;
    float* block = p.codes.data() + (j / nb) * nb * d + j % nb;
    float norm = 0;
    for (int64_t c = 0; c < d; ++c) {
      block[c * nb] = scale * e[c];
      norm += e[c] * e[c];
    }
    p.bias[j] = euclid ? norm : 0.0f;
  }
  return p;
}

// R rows of x (row stride d) against every packed block: best[r] = min_j (bias_j + x_r.(scale e_j)),
// index[r] its lowest j. F and I are float and int32 vectors of the same lane count L; NV vectors
// make a block of NB = NV L codes; R NV accumulators must fit in the registers.
template <class F, class I, int R, int NV>
LOCKSTEP_NC_INLINE void rows_kernel(const float* x, int64_t d, const Packed& p, float* best, int64_t* index) {
  constexpr int L = sizeof(F) / sizeof(float);
  constexpr int NB = NV * L;
  const float inf = std::numeric_limits<float>::infinity();
  // Per lane: the smallest value seen and the block where it was first seen (strict <, blocks in
  // increasing order, so the lowest index on ties within a lane).
  F mins[R][NV];
  I blocks[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) {
      mins[r][v] = inf - F{};
      blocks[r][v] = I{};
    }
  }
  const float* codes = p.codes.data();
  const float* bias = p.bias.data();
  for (int64_t b = 0; b < p.blocks; ++b) {
    const float* e = codes + b * d * NB;
    F acc[R][NV];
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < NV; ++v) acc[r][v] = F{};
    }
    for (int64_t c = 0; c < d; ++c) {
      F ev[NV];
      for (int v = 0; v < NV; ++v) std::memcpy(&ev[v], e + c * NB + v * L, sizeof(F));
      for (int r = 0; r < R; ++r) {
        const F xv = x[r * d + c] - F{};  // a broadcast load (x - 0 folds to x; 0 + x would not)
        for (int v = 0; v < NV; ++v) acc[r][v] = xv * ev[v] + acc[r][v];
      }
    }
    const I block = int32_t(b) - I{};
    for (int v = 0; v < NV; ++v) {
      F bv;
      std::memcpy(&bv, bias + b * NB + v * L, sizeof(F));
      for (int r = 0; r < R; ++r) {
        const F value = acc[r][v] + bv;
        const auto lower = value < mins[r][v];
        mins[r][v] = lower ? value : mins[r][v];
        blocks[r][v] = lower ? block : blocks[r][v];
      }
    }
  }
  // Across lanes: the smallest value, then the lowest index among the lanes that hold it (every lane
  // +inf: index 0). Vector compares and short branch-free scans (a branchy scan over the NB lanes
  // cost ~3% at k 512, d 64).
  for (int r = 0; r < R; ++r) {
    F m = mins[r][0];
    for (int v = 1; v < NV; ++v) m = mins[r][v] < m ? mins[r][v] : m;
    float best_value = m[0];
    for (int l = 1; l < L; ++l) best_value = m[l] < best_value ? m[l] : best_value;
    I first = std::numeric_limits<int32_t>::max() - I{};
    for (int v = 0; v < NV; ++v) {
      I lane;
      for (int l = 0; l < L; ++l) lane[l] = v * L + l;
      const I code = blocks[r][v] * NB + lane;
      first = (mins[r][v] == best_value) & (code < first) ? code : first;
    }
    int32_t best_index = first[0];
    for (int l = 1; l < L; ++l) best_index = first[l] < best_index ? first[l] : best_index;
    best[r] = best_value;
    index[r] = best_index;
  }
}

// All `rows` rows of x; the last rows % R go through `pad` (R d floats), filled with copies of the
// last row. Each row's result depends only on that row, so any split of the rows gives the same
// answer. (Transposing each block of R rows first, so that the broadcasts come from one stream,
// measured no faster.)
template <class F, class I, int R, int NV>
LOCKSTEP_NC_INLINE void search_rows(const float* x, int64_t rows, int64_t d, const Packed& p, float* pad, float* best,
                                    int64_t* index) {
  int64_t r0 = 0;
  for (; r0 + R <= rows; r0 += R) rows_kernel<F, I, R, NV>(x + r0 * d, d, p, best + r0, index + r0);
  if (r0 < rows) {
    float pad_best[R];
    int64_t pad_index[R];
    for (int r = 0; r < R; ++r) {
      std::memcpy(pad + r * d, x + std::min<int64_t>(r0 + r, rows - 1) * d, static_cast<size_t>(d) * sizeof(float));
    }
    rows_kernel<F, I, R, NV>(pad, d, p, pad_best, pad_index);
    for (int64_t r = r0; r < rows; ++r) {
      best[r] = pad_best[r - r0];
      index[r] = pad_index[r - r0];
    }
  }
}

using SearchFn = void (*)(const float*, int64_t, int64_t, const Packed&, float*, float*, int64_t*);

struct Kernel {
  const char* name;
  int64_t block;  // NB: codes per packed block
  int64_t rows;   // R: rows per call of rows_kernel (the pad holds rows * d floats)
  SearchFn search;
};

#ifdef LOCKSTEP_NC_X86
// 32 registers: 12 x 2 accumulators + 2 code vectors + 1 broadcast (12 rows measured ~5% faster
// than 8, and 2 vectors per row faster than 3 or 4).
__attribute__((target("avx512f"))) void search_avx512(const float* x, int64_t rows, int64_t d, const Packed& p,
                                                      float* pad, float* best, int64_t* index) {
  search_rows<vf16, vi16, 12, 2>(x, rows, d, p, pad, best, index);
}
// 16 registers: 6 x 2 accumulators + 2 code vectors + 1 broadcast.
__attribute__((target("avx2,fma"))) void search_avx2(const float* x, int64_t rows, int64_t d, const Packed& p,
                                                     float* pad, float* best, int64_t* index) {
  search_rows<vf8, vi8, 6, 2>(x, rows, d, p, pad, best, index);
}
#endif

// Any target: 128-bit vectors (SSE2, NEON; GCC splits or scalarises them elsewhere).
#if defined(__aarch64__)
constexpr int kGenericRows = 8;  // 32 NEON registers
#else
constexpr int kGenericRows = 4;  // 16 SSE registers
#endif
void search_generic(const float* x, int64_t rows, int64_t d, const Packed& p, float* pad, float* best, int64_t* index) {
  search_rows<vf4, vi4, kGenericRows, 2>(x, rows, d, p, pad, best, index);
}

// Best first.
std::vector<Kernel> supported_kernels() {
  std::vector<Kernel> kernels;
#ifdef LOCKSTEP_NC_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) kernels.push_back({"avx512", 32, 12, search_avx512});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) kernels.push_back({"avx2", 16, 6, search_avx2});
#endif
  kernels.push_back({"generic", 8, kGenericRows, search_generic});
  return kernels;
}

const std::vector<Kernel>& kernels() {
  static const std::vector<Kernel> all = supported_kernels();
  return all;
}

void check_shapes(const at::Tensor& x, const at::Tensor& codebook) {
  LOCKSTEP_CHECK_ARG(x.dim() == 2 && codebook.dim() == 2 && x.size(1) == codebook.size(1),
                     "nearest_code: expected x (n, d) and codebook (k, d), got ", x.sizes(), " and ", codebook.sizes());
  LOCKSTEP_CHECK_ARG(codebook.size(0) >= 1, "nearest_code: the codebook is empty");
  LOCKSTEP_CHECK_ARG(x.device() == codebook.device(), "nearest_code: x is on ", x.device(), " but the codebook on ",
                     codebook.device());
}

NearestCode search(const at::Tensor& x_in, const at::Tensor& codebook_in, Metric metric, const Kernel& kernel) {
  check_shapes(x_in, codebook_in);
  LOCKSTEP_CHECK_ARG(x_in.device().is_cpu(), "nearest_code: kernel ", kernel.name, " runs on the CPU, got x on ",
                     x_in.device());
  LOCKSTEP_CHECK_ARG(codebook_in.size(0) <= std::numeric_limits<int32_t>::max() - kernel.block,
                     "nearest_code: too many codes: ", codebook_in.size(0));
  const at::Tensor x = x_in.detach().to(torch::kFloat32).contiguous();
  const at::Tensor codebook = codebook_in.detach().to(torch::kFloat32).contiguous();
  const int64_t n = x.size(0);
  const int64_t k = codebook.size(0);
  const int64_t d = x.size(1);
  NearestCode out{torch::empty({n}, torch::kInt64), torch::empty({n}, torch::kFloat32)};
  if (n == 0) return out;

  const bool euclid = metric == Metric::Euclidean;
  const Packed packed = pack(codebook.data_ptr<float>(), k, d, kernel.block, euclid);
  const float* xp = x.data_ptr<float>();
  int64_t* index_ptr = out.indices.data_ptr<int64_t>();
  float* score_ptr = out.score.data_ptr<float>();
  // Chunks of at least 256 rows per thread; scratch per thread is the R x d pad.
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    std::vector<float> pad(static_cast<size_t>(kernel.rows * std::max<int64_t>(d, 1)));
    kernel.search(xp + begin * d, end - begin, d, packed, pad.data(), score_ptr + begin, index_ptr + begin);
    for (int64_t r = begin; r < end; ++r) {
      if (euclid) {
        const float* row = xp + r * d;
        float norm = 0;
        for (int64_t c = 0; c < d; ++c) norm += row[c] * row[c];
        score_ptr[r] = std::max(norm + score_ptr[r], 0.0f);
      } else {
        score_ptr[r] = -score_ptr[r];
      }
    }
  });
  return out;
}

// Tokens x codes tiles of the device-independent search: 16 MiB of float32 scores at most.
constexpr int64_t kTileTokens = 2048, kTileCodes = 2048;

}  // namespace

NearestCode nearest_code(const at::Tensor& x, const at::Tensor& codebook, Metric metric) {
  check_shapes(x, codebook);
  if (x.is_cuda() && detail::cuda_kernels_built()) return detail::nearest_code_cuda(x, codebook, metric);
  if (!x.device().is_cpu()) return detail::nearest_code_tiled(x, codebook, metric, kTileTokens, kTileCodes);
  return search(x, codebook, metric, kernels().front());
}

namespace detail {

std::vector<std::string> nearest_code_kernels() {
  std::vector<std::string> names;
  for (const Kernel& kernel : kernels()) names.emplace_back(kernel.name);
  return names;
}

// Per tile: Euclidean scores |e|^2 - 2 x.e (|x|^2 is the same for every code of a token), cosine
// -x.e; min() takes the first of equal values, and a later tile replaces the running best only
// when strictly better, so exact ties go to the lowest code index as in the fused kernel.
NearestCode nearest_code_tiled(const at::Tensor& x_in, const at::Tensor& codebook_in, Metric metric,
                               int64_t tile_tokens, int64_t tile_codes) {
  check_shapes(x_in, codebook_in);
  LOCKSTEP_CHECK_ARG(tile_tokens >= 1 && tile_codes >= 1, "nearest_code: tiles of ", tile_tokens, " x ", tile_codes);
  const at::Tensor x = x_in.detach().to(torch::kFloat32).contiguous();
  const at::Tensor codebook = codebook_in.detach().to(torch::kFloat32).contiguous();
  const int64_t n = x.size(0), k = codebook.size(0);
  const auto on = x.options();
  NearestCode out{torch::empty({n}, on.dtype(torch::kInt64)), torch::empty({n}, on)};
  const bool euclid = metric == Metric::Euclidean;
  const at::Tensor code_norms = euclid ? codebook.square().sum(1) : at::Tensor();
  for (int64_t t0 = 0; t0 < n; t0 += tile_tokens) {
    const int64_t tn = std::min(tile_tokens, n - t0);
    const at::Tensor xt = x.narrow(0, t0, tn);
    at::Tensor best = torch::full({tn}, std::numeric_limits<float>::infinity(), on);
    at::Tensor best_index = torch::zeros({tn}, on.dtype(torch::kInt64));
    for (int64_t c0 = 0; c0 < k; c0 += tile_codes) {
      const int64_t cn = std::min(tile_codes, k - c0);
      const at::Tensor codes = codebook.narrow(0, c0, cn);
      const at::Tensor scores = euclid ? torch::addmm(code_norms.narrow(0, c0, cn).unsqueeze(0), xt, codes.t(), 1, -2)
                                       : torch::mm(xt, codes.t()).neg_();
      const auto [value, index] = scores.min(1);
      const at::Tensor better = value < best;
      best = torch::where(better, value, best);
      best_index = torch::where(better, index + c0, best_index);
    }
    out.indices.narrow(0, t0, tn).copy_(best_index);
    out.score.narrow(0, t0, tn).copy_(euclid ? (best + xt.square().sum(1)).clamp_min_(0) : best.neg());
  }
  return out;
}

NearestCode nearest_code_with_kernel(const at::Tensor& x, const at::Tensor& codebook, Metric metric,
                                     const std::string& kernel) {
  if (kernel == "tiled") return nearest_code_tiled(x, codebook, metric, kTileTokens, kTileCodes);
  if (kernel == "cuda") return nearest_code_cuda(x, codebook, metric);
  for (const Kernel& candidate : kernels()) {
    if (kernel == candidate.name) return search(x, codebook, metric, candidate);
  }
  LOCKSTEP_CHECK_ARG(false, "nearest_code: no kernel '", kernel, "' on this CPU");
  return {};
}

}  // namespace detail
}  // namespace lockstep::quant
