#include "quantizer_cases.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <memory>

#include "lockstep/quant/fsq.h"
#include "lockstep/quant/kmeans.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/vq.h"
#include "quant/nearest_code_kernels.h"

namespace lockstep::bench {
using namespace lockstep::quant;  // the quantizers the cases measure

namespace {

at::Generator seeded(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

// Where the cases run: the CPU, or one CUDA device whose queued work a run waits for.
struct Where {
  int cuda_device = -1;
  at::Device device() const {
    return cuda_device < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device));
  }
  void finish() const {
    if (cuda_device >= 0) torch::cuda::synchronize(cuda_device);
  }
  // Drawn on the host, so both devices time the same numbers.
  at::Tensor normal(std::vector<int64_t> shape, uint64_t seed) const {
    return torch::empty(shape).normal_(0, 1, seeded(seed)).to(device());
  }
  // One training step of `q` on x: forward in training mode, backward of a loss using every output.
  std::function<void()> train_step(std::shared_ptr<Quantizer> q, at::Tensor x) const {
    q->to(device());
    x.requires_grad_(true);
    return [q, x, w = *this] {
      const QuantizerOutput out = q->quantize(x, {nullptr, seeded(1)});
      (out.quantized.sum() + out.total_loss()).backward();
      x.mutable_grad().reset();
      w.finish();
    };
  }
};

constexpr int64_t kBatch = 16, kTokens = 1024, kN = kBatch * kTokens;

// On a CUDA device only: a tokenizer's largest search (65,536 tokens against 2^18 codes), by the
// kernel and by the torch-op path it replaced, and the EMA's per-code statistics.
void add_device_cases(const Where& where, std::vector<BenchCase>& cases) {
  const int64_t n = 65536, k = int64_t{1} << 18;
  for (const int64_t d : {8, 32}) {
    for (const char* path : {"cuda", "tiled"}) {
      BenchCase c;
      c.name = "vq search";  // names and shapes fit the table's 13 and 31 columns
      c.shape =
          "65536 tok d" + std::to_string(d) + " K262144, " + (path == std::string("cuda") ? "kernel" : "torch-op");
      c.tokens = static_cast<double>(n);
      c.work = 2.0 * n * k * d;
      c.counted = "2 n K d flops";
      c.prepare = [where, d, path] {
        auto x = where.normal({n, d}, 11);
        auto codes = where.normal({k, d}, 12);
        return std::function<void()>([x, codes, where, path] {
          quant::detail::nearest_code_with_kernel(x, codes, Metric::Euclidean, path);
          where.finish();
        });
      };
      cases.push_back(c);
    }
  }
  // Beam search's top-k over a chunk of tokens' code values: the kernel, and the stable sort it replaced.
  constexpr int64_t rows = 16384, codes = 65536, top = 8;
  for (const bool kernel : {true, false}) {
    BenchCase c;
    c.name = "top-8 codes";
    c.shape = std::string("16384 x 65536 values, ") + (kernel ? "kernel" : "torch-op");
    c.limit = BenchLimit::Bandwidth;
    c.tokens = static_cast<double>(rows);
    c.work = rows * codes * 4.0;
    c.counted = "bytes: the values read once";
    c.prepare = [where, kernel] {
      auto values = where.normal({rows, codes}, 14);
      return std::function<void()>([values, where, kernel] {
        kernel ? smallest_first(values, top) : quant::detail::smallest_first_sorted(values, top);
        where.finish();
      });
    };
    cases.push_back(c);
  }
  BenchCase c;
  c.name = "ema stats";
  c.shape = "65536 tokens d32 K16384";
  c.limit = BenchLimit::Bandwidth;
  c.tokens = static_cast<double>(n);
  c.work = n * (32 * 4.0 + 8) + 16384 * (32 + 1) * 8.0;  // tokens and indices read, float64 sums written
  c.counted = "bytes: tokens and indices read, float64 counts and sums written";
  c.prepare = [where, n] {
    auto tokens = where.normal({1, n, 32}, 13);
    auto indices = torch::randint(0, 16384, {1, n}, torch::kInt64).to(where.device());
    return std::function<void()>([tokens, indices, where] {
      code_counts_and_sums(tokens, indices, 16384);
      where.finish();
    });
  };
  cases.push_back(c);
}

}  // namespace

std::vector<BenchCase> quantizer_bench_cases(int cuda_device) {
  const Where where{cuda_device};
  std::vector<BenchCase> cases;
  const double search_flops = 2.0 * kN * 512 * 64;
  {
    BenchCase c;
    c.name = "vq search";
    c.shape = "16384 tokens d64 K512";
    c.tokens = kN;
    c.work = search_flops;
    c.counted = "2 n K d flops";
    c.target_fraction = 0.6;
    c.prepare = [where] {
      auto x = where.normal({kN, 64}, 1);
      auto codes = where.normal({512, 64}, 2);
      return std::function<void()>([x, codes, where] {
        nearest_code(x, codes, Metric::Euclidean);
        where.finish();
      });
    };
    cases.push_back(c);
  }
  {
    BenchCase c;
    c.name = "vq fwd+bwd";
    c.shape = "16x1024 d64 K512";
    c.tokens = kN;
    c.work = search_flops;
    c.counted = "the search's 2 n K d flops";
    c.target_ms = 26;
    c.prepare = [where] {
      return where.train_step(std::make_shared<Vq>(VqOptions(64, 512), seeded(3)),
                              where.normal({kBatch, kTokens, 64}, 4));
    };
    cases.push_back(c);
  }
  {
    BenchCase c;
    c.name = "fsq fwd+bwd";
    c.shape = "16x1024 levels 8,5,5,5";
    c.limit = BenchLimit::Bandwidth;
    c.tokens = kN;
    c.work = kN * (4 * 4 * 4 + 8.0);  // x and code in, out, gradient in and out; int64 index
    c.counted = "bytes: 4 floats x (input, code, gradient in, gradient out) + int64 index per token";
    c.target_ms = 0.3;
    c.prepare = [where] {
      return where.train_step(std::make_shared<Fsq>(FsqOptions({8, 5, 5, 5})), where.normal({kBatch, kTokens, 4}, 5));
    };
    cases.push_back(c);
  }
  for (const bool reuse : {true, false}) {
    if (reuse && cuda_device >= 0) continue;  // the fused kernel's own entry point
    const int64_t elements = 50'000'000;
    BenchCase c;
    c.name = "fsq forward";
    c.shape = reuse ? "50M elements, into buffers" : "50M elements, allocating";
    c.limit = BenchLimit::Bandwidth;
    c.tokens = elements / 4.0;
    c.work = elements * (4 + 4 + 8 / 4.0);  // read z, write the code, an int64 index per 4 elements
    c.counted = "bytes: z read, code written, int64 index per token";
    // The target is for the single pass itself; a fresh 300 MB output also pays its page faults.
    c.target_fraction = reuse ? 0.5 : 0;
    c.prepare = [elements, reuse, where] {
      auto fsq = std::make_shared<Fsq>(FsqOptions({8, 5, 5, 5}));
      fsq->eval();
      auto z = where.normal({elements / 4, 4}, 6);
      auto codes = torch::empty_like(z);
      auto indices = torch::empty({elements / 4}, z.options().dtype(torch::kInt64));
      return std::function<void()>([fsq, z, codes, indices, reuse, where]() mutable {
        torch::NoGradGuard no_grad;
        if (reuse)
          fsq->quantize_and_index_out(z, codes, indices);
        else
          fsq->quantize_and_index(z);
        where.finish();
      });
    };
    cases.push_back(c);
  }
  for (const int bits : {10, 16}) {
    const double k = static_cast<double>(int64_t{1} << bits);
    BenchCase c;
    c.name = "lfq fwd+bwd";
    c.shape = "16x1024 K=2^" + std::to_string(bits);
    c.tokens = kN;
    c.work = 6.0 * kN * k;  // the codebook-entropy sum (2 n K) forward and twice that backward
    c.counted = "6 n K flops (the exact codebook entropy's products, forward and backward)";
    c.target_ms = bits == 10 ? 50 : 3000;
    c.target_extra_mib = bits == 16 ? 256 : 0;
    c.prepare = [bits, where] {
      return where.train_step(std::make_shared<Lfq>(LfqOptions(int64_t{1} << bits)),
                              where.normal({kBatch, kTokens, bits}, 7));
    };
    cases.push_back(c);
  }
  {
    const int64_t n = 100'000, k = 1024, d = 64, iters = 10;
    BenchCase c;
    c.name = "kmeans";
    c.shape = "100k x d64, K1024, 10 iters";
    c.tokens = static_cast<double>(n);
    c.work = 2.0 * n * k * d * iters;
    c.counted = "2 n K d flops per iteration";
    c.target_ms = 1500;
    c.prepare = [=] {
      auto tokens = where.normal({1, n, d}, 8);
      auto initial = tokens.narrow(1, 0, k).clone();
      return std::function<void()>([=] {
        LocalReducer local;
        kmeans(tokens, initial, iters, Metric::Euclidean, local);
        where.finish();
      });
    };
    cases.push_back(c);
  }
  if (cuda_device >= 0) add_device_cases(where, cases);
  return cases;
}

}  // namespace lockstep::bench
