#include "lockstep/quant/nearest_code.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "cuda_kernels.h"
#include "lockstep/core/error.h"
#include "nearest_code_kernels.h"
#include "smallest_k.h"

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

// acc[r][v] = x_r.(scale e) for R rows of x (row stride d) and the NV vectors of codes of packed block
// `e`, a fused multiply-add per d step in d order. Every CPU search adds the bias to this one
// accumulation, so a code's value does not depend on which search asks for it, nor on R.
template <class F, int R, int NV>
LOCKSTEP_NC_INLINE void block_dots(const float* x, int64_t d, const float* e, F (&acc)[R][NV]) {
  constexpr int L = sizeof(F) / sizeof(float);
  constexpr int NB = NV * L;
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
    F acc[R][NV];
    block_dots<F, R, NV>(x, d, codes + b * d * NB, acc);
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

// R rows of x against every packed block, each value bias_j + x_r.(scale e_j) stored: out[r k + j]
// for the k codes (rows_kernel's values, before its fold).
template <class F, int R, int NV>
LOCKSTEP_NC_INLINE void rows_values(const float* x, int64_t d, const Packed& p, int64_t k, float* out) {
  constexpr int L = sizeof(F) / sizeof(float);
  constexpr int NB = NV * L;
  const float* codes = p.codes.data();
  const float* bias = p.bias.data();
  for (int64_t b = 0; b < p.blocks; ++b) {
    F acc[R][NV];
    block_dots<F, R, NV>(x, d, codes + b * d * NB, acc);
    for (int v = 0; v < NV; ++v) {
      F bv;
      std::memcpy(&bv, bias + b * NB + v * L, sizeof(F));
      const int64_t j0 = b * NB + v * L;
      const int64_t lanes = std::min<int64_t>(L, k - j0);  // the last block's lanes past k are padding
      for (int r = 0; r < R; ++r) {
        const F value = acc[r][v] + bv;
        if (lanes == L) {
          std::memcpy(out + r * k + j0, &value, sizeof(F));
        } else {
          for (int64_t l = 0; l < lanes; ++l) out[r * k + j0 + l] = value[l];
        }
      }
    }
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

// All `rows` rows' values (rows x k, into out); the last rows % R through `pad` (R d floats) and
// `pad_out` (R k floats), as search_rows does.
template <class F, int R, int NV>
LOCKSTEP_NC_INLINE void values_rows(const float* x, int64_t rows, int64_t d, const Packed& p, int64_t k, float* pad,
                                    float* pad_out, float* out) {
  int64_t r0 = 0;
  for (; r0 + R <= rows; r0 += R) rows_values<F, R, NV>(x + r0 * d, d, p, k, out + r0 * k);
  if (r0 < rows) {
    for (int r = 0; r < R; ++r) {
      std::memcpy(pad + r * d, x + std::min<int64_t>(r0 + r, rows - 1) * d, static_cast<size_t>(d) * sizeof(float));
    }
    rows_values<F, R, NV>(pad, d, p, k, pad_out);
    std::memcpy(out + r0 * k, pad_out, static_cast<size_t>((rows - r0) * k) * sizeof(float));
  }
}

using SearchFn = void (*)(const float*, int64_t, int64_t, const Packed&, float*, float*, int64_t*);
using ValuesFn = void (*)(const float*, int64_t, int64_t, const Packed&, int64_t, float*, float*, float*);

struct Kernel {
  const char* name;
  int64_t block;  // NB: codes per packed block
  int64_t rows;   // R: rows per call of rows_kernel (the pad holds rows * d floats)
  SearchFn search;
  ValuesFn values;  // the same arithmetic as search, every value stored
};

#ifdef LOCKSTEP_NC_X86
// 32 registers: 12 x 2 accumulators + 2 code vectors + 1 broadcast (12 rows measured ~5% faster
// than 8, and 2 vectors per row faster than 3 or 4).
__attribute__((target("avx512f"))) void search_avx512(const float* x, int64_t rows, int64_t d, const Packed& p,
                                                      float* pad, float* best, int64_t* index) {
  search_rows<vf16, vi16, 12, 2>(x, rows, d, p, pad, best, index);
}
__attribute__((target("avx512f"))) void values_avx512(const float* x, int64_t rows, int64_t d, const Packed& p,
                                                      int64_t k, float* pad, float* pad_out, float* out) {
  values_rows<vf16, 12, 2>(x, rows, d, p, k, pad, pad_out, out);
}
// 16 registers: 6 x 2 accumulators + 2 code vectors + 1 broadcast.
__attribute__((target("avx2,fma"))) void search_avx2(const float* x, int64_t rows, int64_t d, const Packed& p,
                                                     float* pad, float* best, int64_t* index) {
  search_rows<vf8, vi8, 6, 2>(x, rows, d, p, pad, best, index);
}
__attribute__((target("avx2,fma"))) void values_avx2(const float* x, int64_t rows, int64_t d, const Packed& p,
                                                     int64_t k, float* pad, float* pad_out, float* out) {
  values_rows<vf8, 6, 2>(x, rows, d, p, k, pad, pad_out, out);
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
void values_generic(const float* x, int64_t rows, int64_t d, const Packed& p, int64_t k, float* pad, float* pad_out,
                    float* out) {
  values_rows<vf4, kGenericRows, 2>(x, rows, d, p, k, pad, pad_out, out);
}

// Best first.
std::vector<Kernel> supported_kernels() {
  std::vector<Kernel> kernels;
#ifdef LOCKSTEP_NC_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) kernels.push_back({"avx512", 32, 12, search_avx512, values_avx512});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    kernels.push_back({"avx2", 16, 6, search_avx2, values_avx2});
#endif
  kernels.push_back({"generic", 8, kGenericRows, search_generic, values_generic});
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

// |x|^2 of a row, as the CPU searches add it to their Euclidean scores.
float squared_norm(const float* row, int64_t d) {
  float norm = 0;
  for (int64_t c = 0; c < d; ++c) norm += row[c] * row[c];
  return norm;
}

// x and the codebook as float32 copies a kernel can read, checked.
std::pair<at::Tensor, at::Tensor> cpu_inputs(const at::Tensor& x_in, const at::Tensor& codebook_in,
                                             const Kernel& kernel) {
  check_shapes(x_in, codebook_in);
  LOCKSTEP_CHECK_ARG(x_in.device().is_cpu(), "nearest_code: kernel ", kernel.name, " runs on the CPU, got x on ",
                     x_in.device());
  LOCKSTEP_CHECK_ARG(codebook_in.size(0) <= std::numeric_limits<int32_t>::max() - kernel.block,
                     "nearest_code: too many codes: ", codebook_in.size(0));
  return {x_in.detach().to(torch::kFloat32).contiguous(), codebook_in.detach().to(torch::kFloat32).contiguous()};
}

NearestCode search(const at::Tensor& x_in, const at::Tensor& codebook_in, Metric metric, const Kernel& kernel) {
  const auto [x, codebook] = cpu_inputs(x_in, codebook_in, kernel);
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
      score_ptr[r] = euclid ? std::max(squared_norm(xp + r * d, d) + score_ptr[r], 0.0f) : -score_ptr[r];
    }
  });
  return out;
}

// search()'s values, every one of them (n, k).
at::Tensor cpu_values(const at::Tensor& x_in, const at::Tensor& codebook_in, Metric metric, const Kernel& kernel) {
  const auto [x, codebook] = cpu_inputs(x_in, codebook_in, kernel);
  const int64_t n = x.size(0), k = codebook.size(0), d = x.size(1);
  at::Tensor out = torch::empty({n, k}, torch::kFloat32);
  if (n == 0) return out;
  const Packed packed = pack(codebook.data_ptr<float>(), k, d, kernel.block, metric == Metric::Euclidean);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    std::vector<float> pad(static_cast<size_t>(kernel.rows * std::max<int64_t>(d, 1)));
    std::vector<float> pad_out(static_cast<size_t>(kernel.rows * k));
    kernel.values(xp + begin * d, end - begin, d, packed, k, pad.data(), pad_out.data(), op + begin * k);
  });
  return out;
}

at::Tensor cpu_squared_norms(const at::Tensor& x_in) {
  const at::Tensor x = x_in.detach().to(torch::kFloat32).contiguous();
  const int64_t n = x.size(0), d = x.size(1);
  at::Tensor out = torch::empty({n}, torch::kFloat32);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = squared_norm(xp + r * d, d);
  });
  return out;
}

// Tokens x codes tiles of the device-independent search: 16 MiB of float32 scores at most.
constexpr int64_t kTileTokens = 2048, kTileCodes = 2048;

// One tile of the device-independent search's values: Euclidean |e|^2 - 2 x.e, cosine -x.e.
at::Tensor tile_values(const at::Tensor& xt, const at::Tensor& codes, const at::Tensor& code_norms) {
  return code_norms.defined() ? torch::addmm(code_norms.unsqueeze(0), xt, codes.t(), 1, -2)
                              : torch::mm(xt, codes.t()).neg_();
}

// nearest_code_tiled's values, every one of them (n, k), from the same products: its tiles, with
// token tiles counted from x's first row.
at::Tensor tiled_values(const at::Tensor& x_in, const at::Tensor& codebook_in, Metric metric, int64_t tile_tokens,
                        int64_t tile_codes) {
  check_shapes(x_in, codebook_in);
  const at::Tensor x = x_in.detach().to(torch::kFloat32).contiguous();
  const at::Tensor codebook = codebook_in.detach().to(torch::kFloat32).contiguous();
  const int64_t n = x.size(0), k = codebook.size(0);
  at::Tensor out = torch::empty({n, k}, x.options());
  const at::Tensor code_norms = metric == Metric::Euclidean ? codebook.square().sum(1) : at::Tensor();
  for (int64_t t0 = 0; t0 < n; t0 += tile_tokens) {
    const int64_t tn = std::min(tile_tokens, n - t0);
    for (int64_t c0 = 0; c0 < k; c0 += tile_codes) {
      const int64_t cn = std::min(tile_codes, k - c0);
      out.narrow(0, t0, tn).narrow(1, c0, cn).copy_(
          tile_values(x.narrow(0, t0, tn), codebook.narrow(0, c0, cn),
                      code_norms.defined() ? code_norms.narrow(0, c0, cn) : at::Tensor()));
    }
  }
  return out;
}

// Whether value a of index i ranks before value b of index j: the smaller first, equal values in
// index order, NaN as +inf (a fused search never takes a NaN: every value NaN or +inf gives index 0).
template <class T>
bool ranks_before(T a, int64_t i, T b, int64_t j) {
  if (std::isnan(a)) a = std::numeric_limits<T>::infinity();
  if (std::isnan(b)) b = std::numeric_limits<T>::infinity();
  return a < b || (a == b && i < j);
}

template <class T>
void cpu_smallest_first(const at::Tensor& values, int64_t k, at::Tensor& out) {
  const int64_t n = values.size(0), m = values.size(1);
  const T* vp = values.data_ptr<T>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> order(static_cast<size_t>(m));
    for (int64_t r = begin; r < end; ++r) {
      const T* row = vp + r * m;
      const auto before = [row](int64_t i, int64_t j) { return ranks_before(row[i], i, row[j], j); };
      if (k == 1) {  // a scan, as the fused searches fold
        int64_t best = 0;
        for (int64_t j = 1; j < m; ++j) best = before(j, best) ? j : best;
        op[r] = best;
        continue;
      }
      std::iota(order.begin(), order.end(), int64_t{0});
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      std::copy(order.begin(), order.begin() + k, op + r * k);
    }
  });
}

// The values a search with `kernel` compares (see nearest_code_with_kernel for the names).
at::Tensor values_with_kernel(const at::Tensor& x, const at::Tensor& codebook, Metric metric,
                              const std::string& kernel) {
  if (kernel == "tiled") return tiled_values(x, codebook, metric, kTileTokens, kTileCodes);
  if (kernel == "cuda") return detail::code_scores_cuda(x, codebook, metric);
  for (const Kernel& candidate : kernels()) {
    if (kernel == candidate.name) return cpu_values(x, codebook, metric, candidate);
  }
  LOCKSTEP_CHECK_ARG(false, "nearest_code: no kernel '", kernel, "' on this CPU");
  return {};
}

// |x|^2 of each row as the search with `kernel` adds it to its Euclidean score.
at::Tensor squared_norms_with_kernel(const at::Tensor& x, const std::string& kernel) {
  if (kernel == "tiled") return x.detach().to(torch::kFloat32).square().sum(1);
  if (kernel == "cuda") return detail::squared_norms_cuda(x);
  return cpu_squared_norms(x);
}

// The kernel nearest_code runs for tensors on x's device.
std::string default_kernel(const at::Tensor& x) {
  if (x.is_cuda() && detail::cuda_kernels_built()) return "cuda";
  if (!x.device().is_cpu()) return "tiled";
  return kernels().front().name;
}

}  // namespace

NearestCode nearest_code(const at::Tensor& x, const at::Tensor& codebook, Metric metric) {
  check_shapes(x, codebook);
  if (x.is_cuda() && detail::cuda_kernels_built()) return detail::nearest_code_cuda(x, codebook, metric);
  if (!x.device().is_cpu()) return detail::nearest_code_tiled(x, codebook, metric, kTileTokens, kTileCodes);
  return search(x, codebook, metric, kernels().front());
}

at::Tensor code_scores(const at::Tensor& x, const at::Tensor& codebook, Metric metric) {
  check_shapes(x, codebook);
  return values_with_kernel(x, codebook, metric, default_kernel(x));
}

at::Tensor smallest_first(const at::Tensor& values_in, int64_t k) {
  LOCKSTEP_CHECK_ARG(values_in.dim() == 2 && k >= 1 && k <= values_in.size(1),
                     "smallest_first: expected values (n, m) and 1 <= k <= m, got ", values_in.sizes(), " and k = ", k);
  if (values_in.is_cuda() && detail::cuda_kernels_built() && k <= smallest_k::kMaxK &&
      at::isFloatingType(values_in.scalar_type()) && values_in.scalar_type() != torch::kFloat64 &&
      values_in.size(1) <= std::numeric_limits<int32_t>::max()) {  // float32 holds every such value exactly
    return detail::smallest_first_cuda(values_in, k);
  }
  if (!values_in.device().is_cpu()) return detail::smallest_first_sorted(values_in, k);
  // float64 and integers (which float32 would round into ties) ranked as doubles.
  const bool wide = values_in.scalar_type() == torch::kFloat64 || !at::isFloatingType(values_in.scalar_type());
  const at::Tensor values = values_in.detach().to(wide ? torch::kFloat64 : torch::kFloat32).contiguous();
  at::Tensor out = torch::empty({values.size(0), k}, torch::kInt64);
  if (wide) {
    cpu_smallest_first<double>(values, k, out);
  } else {
    cpu_smallest_first<float>(values, k, out);
  }
  return out;
}

NearestCode nearest_codes(const at::Tensor& x, const at::Tensor& codebook, Metric metric, int64_t k) {
  check_shapes(x, codebook);
  return detail::nearest_codes_with_kernel(x, codebook, metric, k, default_kernel(x));
}

namespace detail {

at::Tensor smallest_first_sorted(const at::Tensor& values_in, int64_t k) {
  // NaN as +inf; a stable sort and argmin keep the first of equal values.
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor values = values_in.detach().nan_to_num(inf, inf, -inf);
  if (k == 1) return values.argmin(1, /*keepdim=*/true);
  return std::get<1>(values.sort(/*stable=*/true, /*dim=*/1, /*descending=*/false)).narrow(1, 0, k).contiguous();
}

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
      const at::Tensor scores =
          tile_values(xt, codebook.narrow(0, c0, cn), euclid ? code_norms.narrow(0, c0, cn) : at::Tensor());
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

at::Tensor code_scores_with_kernel(const at::Tensor& x, const at::Tensor& codebook, Metric metric,
                                   const std::string& kernel) {
  check_shapes(x, codebook);
  return values_with_kernel(x, codebook, metric, kernel);
}

// Chunks of rows, each's values ranked whole. The tiled search's products may round by their place
// in a tile, so its chunks are its token tiles; the fused kernels' values depend on nothing else.
NearestCode nearest_codes_with_kernel(const at::Tensor& x_in, const at::Tensor& codebook, Metric metric, int64_t k,
                                      const std::string& kernel) {
  check_shapes(x_in, codebook);
  const int64_t codes = codebook.size(0);
  LOCKSTEP_CHECK_ARG(k >= 1 && k <= codes, "nearest_codes: k = ", k, " must be in [1, ", codes, "]");
  const at::Tensor x = x_in.detach();
  const int64_t n = x.size(0);
  const auto on = x.options().dtype(torch::kFloat32);
  NearestCode out{torch::empty({n, k}, on.dtype(torch::kInt64)), torch::empty({n, k}, on)};
  const int64_t chunk = kernel == "tiled" ? kTileTokens : std::max<int64_t>(1, (int64_t{8} << 20) / codes);  // 32 MiB
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    const at::Tensor rows = x.narrow(0, start, len);
    const at::Tensor values = values_with_kernel(rows, codebook, metric, kernel);
    const at::Tensor index = smallest_first(values, k);
    const at::Tensor chosen = values.gather(1, index);
    out.indices.narrow(0, start, len).copy_(index);
    out.score.narrow(0, start, len)
        .copy_(metric == Metric::Euclidean
                   ? (squared_norms_with_kernel(rows, kernel).unsqueeze(1) + chosen).clamp_min(0)
                   : chosen.neg());
  }
  return out;
}

}  // namespace detail
}  // namespace lockstep::quant
