// The device-independent paths on a CUDA device against the fused CPU kernels, the NCCL transport
// on one rank, and training with train.device = cuda:0. They run where a GPU is visible (a GPU machine running the
// suite) and show as skipped everywhere else, saying why.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>

#include "dist/rank_threads.h"
#include "io/test_temp_dir.h"

#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/process_group.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/quant/kmeans.h"
#include "lockstep/quant/lfq.h"
#include "lockstep/quant/nearest_code.h"
#include "lockstep/quant/vq.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/metrics.h"
#include "lockstep/train/run_dir.h"
#include "lockstep/train/trainer.h"
#include "train/small_run.h"

namespace lockstep::quant {
namespace {

class CudaPathsBase : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!LOCKSTEP_HAVE_CUDA) GTEST_SKIP() << "this build has no CUDA paths (a LibTorch without CUDA)";
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
    torch::manual_seed(31);
  }
  const torch::Device cuda{torch::kCUDA, 0};
};
using CudaPaths = CudaPathsBase;

TEST_F(CudaPaths, NearestCodeEqualsTheFusedKernel) {
  const at::Tensor x = torch::randn({5000, 32}), codebook = torch::randn({1500, 32});
  for (Metric metric : {Metric::Euclidean, Metric::Cosine}) {
    const NearestCode cpu = nearest_code(x, codebook, metric);
    const NearestCode gpu = nearest_code(x.to(cuda), codebook.to(cuda), metric);
    ASSERT_TRUE(gpu.indices.is_cuda());
    EXPECT_LE((gpu.indices.cpu() != cpu.indices).sum().item<int64_t>(), 5);  // near-ties only
    EXPECT_TRUE(torch::allclose(gpu.score.cpu(), cpu.score, 1e-3, 1e-3));
  }
}

TEST_F(CudaPaths, FsqCodesIndicesGradientsAndNoiseEqualTheFusedKernel) {
  Fsq fsq(FsqOptions({7, 5, 5, 4}).preserve_symmetry(true).noise_dropout(0.3));
  const at::Tensor z = torch::randn({4000, 4}) * 2;
  const at::Tensor zc = z.clone().requires_grad_(), zg = z.to(cuda).requires_grad_();
  const FsqCodes cpu = fsq.quantize_and_index(zc, at::detail::createCPUGenerator(5), 17);
  const FsqCodes gpu = fsq.quantize_and_index(zg, at::detail::createCPUGenerator(5), 17);
  const at::Tensor same = gpu.codes.detach().cpu() == cpu.codes.detach();
  EXPECT_GE(same.to(torch::kFloat64).mean().item<double>(), 0.999);
  const at::Tensor w = torch::randn_like(z);
  (cpu.codes * w).sum().backward();
  (gpu.codes * w.to(cuda)).sum().backward();
  EXPECT_TRUE(torch::allclose(zg.grad().cpu(), zc.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(torch::equal(fsq.indices_to_codes(gpu.indices).cpu(), fsq.indices_to_codes(gpu.indices.cpu())));
}

TEST_F(CudaPaths, CodeStatisticsRotationAndLfqEntropyEqualTheCpu) {
  const at::Tensor tokens = torch::randn({2, 3000, 16});
  const at::Tensor indices = torch::randint(0, 64, {2, 3000}, torch::kInt64);
  const auto cpu = code_counts_and_sums(tokens, indices, 64);
  const auto gpu = code_counts_and_sums(tokens.to(cuda), indices.to(cuda), 64);
  EXPECT_TRUE(torch::equal(gpu[0].cpu(), cpu[0]));
  EXPECT_TRUE(torch::allclose(gpu[1].cpu(), cpu[1], 1e-12, 1e-12));

  const at::Tensor x = torch::randn({1000, 32}), q = torch::randn({1000, 32});
  const at::Tensor xc = x.clone().requires_grad_(), xg = x.to(cuda).requires_grad_();
  const at::Tensor rc = rotate_to(xc, q), rg = rotate_to(xg, q.to(cuda));
  EXPECT_TRUE(torch::allclose(rg.detach().cpu(), rc.detach(), 1e-4, 1e-4));
  rc.sum().backward();
  rg.sum().backward();
  EXPECT_TRUE(torch::allclose(xg.grad().cpu(), xc.grad(), 1e-4, 1e-4));

  const at::Tensor bits = torch::randn({2, 700, 12}) * 0.3;
  const at::Tensor bc = bits.clone().requires_grad_(), bg = bits.to(cuda).requires_grad_();
  const at::Tensor sc = lfq_sum_probs(bc, 2.0, 1.0), sg = lfq_sum_probs(bg, 2.0, 1.0);
  EXPECT_TRUE(torch::allclose(sg.detach().cpu(), sc.detach(), 1e-4, 1e-5));
  const at::Tensor wk = torch::randn_like(sc);
  (sc * wk).sum().backward();
  (sg * wk.to(cuda)).sum().backward();
  EXPECT_TRUE(torch::allclose(bg.grad().cpu(), bc.grad(), 1e-3, 1e-5));
}

// One rank with the NCCL transport: CUDA tensors go over NCCL, fingerprints and CPU tensors over
// Gloo, and a call that mixes the two devices is refused before anything moves.
TEST_F(CudaPaths, OneRankGroupCarriesCudaTensorsOverNccl) {
  if (!LOCKSTEP_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL transport";
  dist::GroupOptions o;
  o.master_port = 0;
  o.cuda_device = 0;
  o.timeout = std::chrono::seconds(60);
  const auto group = dist::make_process_group(o);
  EXPECT_NE(group->describe().find("nccl on cuda:0"), std::string::npos) << group->describe();
  std::vector<at::Tensor> t{torch::full({1000}, 3.0f, torch::TensorOptions().device(cuda))};
  group->all_reduce(t, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.cuda"));
  EXPECT_TRUE(torch::equal(t[0].cpu(), torch::full({1000}, 3.0f)));
  std::vector<at::Tensor> cpu{torch::ones({3})};
  group->all_reduce(cpu, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.cpu"));
  std::vector<at::Tensor> mixed{torch::ones({3}), torch::ones({3}, torch::TensorOptions().device(cuda))};
  EXPECT_THROW(group->all_reduce(mixed, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.mixed")), InvalidArgument);
}

// Two ranks on two GPUs: a sum over NCCL, then calls that disagree in shape are refused on both
// ranks by the fingerprints (on Gloo) before NCCL sees them, instead of hanging the GPUs.
TEST_F(CudaPaths, TwoGpusSumOverNcclAndAMismatchFailsOnBothRanks) {
  if (!LOCKSTEP_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL transport";
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << torch::cuda::device_count() << " visible";
  std::vector<std::string> messages(2);
  const auto errors = dist::test_util::run_ranks(
      2,
      [&](dist::Group& g, int r) {
        const auto on = torch::TensorOptions().device(torch::Device(torch::kCUDA, r));
        std::vector<at::Tensor> t{torch::full({256}, static_cast<float>(r + 1), on)};
        g.all_reduce(t, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.sum"));
        EXPECT_TRUE(torch::equal(t[0].cpu(), torch::full({256}, 3.0f)));
        std::vector<at::Tensor> wrong{torch::ones({r == 0 ? 4 : 5}, on)};
        g.all_reduce(wrong, dist::ReduceOp::Sum, LOCKSTEP_CALL_SITE("test.mismatch"));
      },
      dist::test_util::Join::GlooAndNccl);
  for (int r = 0; r < 2; ++r) {
    const std::string m = dist::test_util::message_of<dist::CollectiveMismatch>(errors[r]);
    EXPECT_NE(m.find("test.mismatch"), std::string::npos) << "rank " << r << ": " << m;
  }
}

}  // namespace
}  // namespace lockstep::quant

namespace lockstep::train {
namespace {

class CudaTraining : public quant::CudaPathsBase {};

Config gpu_config(const std::string& quantizer, int64_t steps, const std::string& device) {
  ::lockstep::test_util::SmallRun r;
  r.steps = steps;
  r.train_images = 256;
  r.test_images = 64;
  r.log_every = 1;
  r.grid_images = 0;
  Config c = ::lockstep::test_util::small_run(r);
  c.set("train.device", device);
  c.set("quantizer.name", quantizer);
  // Every randomised path: k-means, dead codes, stochastic codes, layer dropout, entropy subsets, noise.
  c.set("quantizer.vq.kmeans_init", true);
  c.set("quantizer.vq.threshold_ema_dead_code", 2.0);
  c.set("quantizer.vq.stochastic_sample_codes", true);
  c.set("quantizer.vq.sample_codebook_temp", 0.5);
  c.set("quantizer.residual.quantize_dropout", true);
  c.set("quantizer.lfq.frac_per_sample_entropy", 0.5);
  c.set("quantizer.fsq.noise_dropout", 0.2);
  c.set("quantizer.fsq.preserve_symmetry", true);  // what noise dropout needs
  return c;
}

double first_loss(const std::string& run) {
  for (const auto& r : read_metrics(metrics_path(run))) {
    for (const auto& [key, value] : r.values) {
      if (r.kind == "train" && key == "loss") return value;
    }
  }
  return NAN;
}

// Each quantizer trains on cuda:0; its first loss (same weights, same batch, before any update) is
// the CPU's; the checkpoint resumes on the CPU.
// The GPU test's configuration, trained on the CPU here: a configuration that the options' checks
// refuse is caught on every machine, not first on a GPU.
TEST(CudaTrainingConfig, EveryQuantizersConfigurationTrainsOnTheCpu) {
  for (const char* q : {"fsq", "lfq", "vq", "residual-vq", "residual-fsq", "residual-lfq"}) {
    SCOPED_TRACE(q);
    test_util::TempDir tmp;
    EXPECT_EQ(
        Trainer::create(gpu_config(q, 1, "cpu"), tmp.file("cpu"), dist::make_single_process_group())->run({}).steps, 1);
  }
}

TEST_F(CudaTraining, EveryQuantizerTrainsOnTheGpuAndResumesOnTheCpu) {
  for (const char* q : {"fsq", "lfq", "vq", "residual-vq", "residual-fsq", "residual-lfq"}) {
    SCOPED_TRACE(q);
    test_util::TempDir tmp;
    const TrainSummary gpu =
        Trainer::create(gpu_config(q, 4, "cuda:0"), tmp.file("gpu"), dist::make_single_process_group())->run({});
    Trainer::create(gpu_config(q, 1, "cpu"), tmp.file("cpu"), dist::make_single_process_group())->run({});
    EXPECT_EQ(gpu.steps, 4);
    EXPECT_TRUE(std::isfinite(gpu.test.mse));
    EXPECT_NEAR(first_loss(tmp.file("gpu")), first_loss(tmp.file("cpu")),
                1e-3 * std::abs(first_loss(tmp.file("cpu"))) + 1e-4);
    const TrainSummary resumed =
        Trainer::resume(tmp.file("gpu"), {"train.device=cpu", "train.steps=5"}, dist::make_single_process_group())
            ->run({});
    EXPECT_EQ(resumed.steps, 5);
  }
}

}  // namespace
}  // namespace lockstep::train
