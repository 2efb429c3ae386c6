// G4 for the quantizers: k training steps on W ranks holding uneven parts of a batch give the
// codebooks, losses and input gradients of one process holding all of it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/dist/group_reducer.h"
#include "lockstep/quant/registry.h"
#include "lockstep/train/config.h"
#include "lockstep/train/model_factory.h"
#include "rank_threads.h"

namespace lockstep::dist {
namespace {

struct Case {
  std::string name;
  std::string quantizer;
  std::vector<std::string> settings;
  std::vector<int64_t> split;  // batch items per rank
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::shared_ptr<quant::Quantizer> build(const Case& c) {
  train::Config config(train::lockstep_schema());
  for (const auto& s : c.settings) config.set_from_string(s);
  torch::manual_seed(7);  // the same initial codebooks and projections on every rank
  return quant::make_quantizer(c.quantizer, train::quantizer_options(config, c.quantizer));
}

at::Generator step_generator(int step) { return at::detail::createCPUGenerator(1000 + step); }

struct Trace {
  std::vector<double> losses;
  std::vector<at::Tensor> grads;                  // per step, of this holder's part of the batch
  std::map<std::string, at::Tensor> final_state;  // buffers and parameters after the last step
};

constexpr int kSteps = 3;

// Runs kSteps on `x` (this holder's part); the loss is weighted by part / whole * holders, as the
// trainer does, so that averaging over holders gives the whole batch's loss and gradient.
Trace train(quant::Quantizer& q, quant::Reducer& reducer, const std::vector<at::Tensor>& batches, double weight,
            int64_t first_item) {
  Trace t;
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor x = batches[step].clone().requires_grad_();
    quant::QuantizeContext ctx{&reducer, step_generator(step)};
    ctx.first_item = first_item;
    const quant::QuantizerOutput out = q.quantize(x, ctx);
    // A stand-in for the decoder's loss, so that quantizers without losses (FSQ) are checked too.
    const at::Tensor loss = (out.total_loss() + out.quantized.pow(2).mean()) * weight;
    loss.backward();
    t.losses.push_back(loss.item<double>());
    t.grads.push_back(x.grad().clone());
  }
  for (const auto& b : q.named_buffers()) t.final_state[b.key()] = b.value().clone();
  return t;
}

// Trains c's quantizer on ranks holding `split` items of each batch (threads of a real group).
// Quantizers are built here, one after another: construction draws from torch's default generator,
// which rank threads building at once would share.
std::vector<Trace> train_on_ranks(const Case& c, const std::vector<int64_t>& split,
                                  const std::vector<at::Tensor>& batches) {
  const int w = static_cast<int>(split.size());
  const int64_t items = batches[0].size(0);
  std::vector<std::shared_ptr<quant::Quantizer>> quantizers;
  for (int r = 0; r < w; ++r) quantizers.push_back(build(c));
  std::vector<Trace> traces(w);
  const auto errors = test_util::run_ranks(w, [&](Group& g, int r) {
    int64_t first = 0;
    for (int k = 0; k < r; ++k) first += split[k];
    std::vector<at::Tensor> mine;
    for (const auto& b : batches) mine.push_back(b.narrow(0, first, split[r]));
    GroupReducer reducer(std::shared_ptr<Group>(&g, [](Group*) {}));
    const PhaseScope training(g, Phase::train_step(1));  // every rank runs the same steps
    traces[r] =
        train(*quantizers[r], reducer, mine, static_cast<double>(split[r]) * w / static_cast<double>(items), first);
  });
  for (int r = 0; r < w; ++r) EXPECT_FALSE(errors[r]) << test_util::message_of<std::exception>(errors[r]);
  return traces;
}

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, RanksWithUnevenBatchesMatchOneProcess) {
  const Case& c = GetParam();
  const int w = static_cast<int>(c.split.size());
  int64_t items = 0;
  for (int64_t n : c.split) items += n;
  auto reference = build(c);
  std::vector<at::Tensor> batches;
  for (int step = 0; step < kSteps; ++step) {
    batches.push_back(torch::empty({items, 6, reference->dim()}).normal_(0, 1, at::detail::createCPUGenerator(step)));
  }
  quant::LocalReducer local;
  const Trace single = train(*reference, local, batches, 1.0, 0);

  const std::vector<Trace> traces = train_on_ranks(c, c.split, batches);
  ASSERT_EQ(traces.size(), static_cast<size_t>(w));
  if (::testing::Test::HasFailure()) return;

  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    std::vector<at::Tensor> grads;
    for (int r = 0; r < w; ++r) {
      loss += traces[r].losses[step] / w;
      grads.push_back(traces[r].grads[step] / w);
    }
    EXPECT_NEAR(loss, single.losses[step], 1e-5 * std::max(1.0, std::abs(single.losses[step]))) << "step " << step;
    const at::Tensor grad = torch::cat(grads);
    EXPECT_TRUE(torch::allclose(grad, single.grads[step], 1e-5, 1e-6))
        << "step " << step << ": " << (grad - single.grads[step]).abs().max();
  }
  for (int r = 0; r < w; ++r) {
    for (const auto& [name, value] : single.final_state) {
      EXPECT_TRUE(torch::allclose(traces[r].final_state.at(name), value, 1e-5, 1e-5))
          << "rank " << r << " " << name << ": " << (traces[r].final_state.at(name) - value).abs().max();
    }
  }
}

// Bitwise, not just close: tokens from flat image regions repeat exactly, so codes tie, and a sum
// that differs in its last bit between W ranks and one process flips which code wins, after which
// the codebooks drift apart (2.09 after 60 steps before the statistics were summed in float64).
// With k-means, dead codes and EMA, W in {2, 3} must give the one-process codebook bit for bit.
TEST(Equivalence, CodebooksAreBitwiseTheOneProcessOnesWithRepeatedTokens) {
  const Case c{"vq_kmeans_dead_codes",
               "vq",
               {"quantizer.vq.codebook_size=24", "quantizer.vq.kmeans_init=true", "quantizer.vq.kmeans_iters=4",
                "quantizer.vq.threshold_ema_dead_code=2"},
               {}};
  for (const std::vector<int64_t> split : {std::vector<int64_t>{9, 7}, std::vector<int64_t>{6, 5, 5}}) {
    const int w = static_cast<int>(split.size());
    auto reference = build(c);
    std::vector<at::Tensor> batches;
    for (int step = 0; step < kSteps; ++step) {
      at::Generator gen = at::detail::createCPUGenerator(50 + step);
      at::Tensor b = torch::empty({16, 12, reference->dim()}).normal_(0, 1, gen);
      const at::Tensor flat = torch::empty({3, reference->dim()}).normal_(0, 1, gen);  // "backgrounds"
      for (int64_t item = 0; item < 16; ++item) {
        for (int64_t t = 0; t < 8; ++t) b[item][t].copy_(flat[(item + t) % 3]);
      }
      batches.push_back(b);
    }
    quant::LocalReducer local;
    const Trace single = train(*reference, local, batches, 1.0, 0);
    const std::vector<Trace> traces = train_on_ranks(c, split, batches);
    if (::testing::Test::HasFailure()) return;
    for (int r = 0; r < w; ++r) {
      for (const auto& [name, value] : single.final_state) {
        EXPECT_TRUE(torch::equal(traces[r].final_state.at(name), value))
            << w << " ranks, rank " << r << ", " << name << ": "
            << (traces[r].final_state.at(name) - value).abs().max().item<float>();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Quantizers, Equivalence,
    ::testing::Values(Case{"vq_kmeans_dead_codes_5_3",
                           "vq",
                           {"quantizer.vq.codebook_size=16", "quantizer.vq.kmeans_init=true",
                            "quantizer.vq.kmeans_iters=3", "quantizer.vq.threshold_ema_dead_code=1.5"},
                           {5, 3}},
                      Case{"vq_heads_3_3_2",
                           "vq",
                           {"quantizer.vq.codebook_size=12", "quantizer.vq.heads=2", "quantizer.vq.codebook_dim=4",
                            "quantizer.vq.separate_codebook_per_head=true", "quantizer.vq.threshold_ema_dead_code=1.0"},
                           {3, 3, 2}},
                      Case{"fsq_5_3", "fsq", {}, {5, 3}},
                      // Randomness keyed by each token's place in the global batch: the same draws as one process.
                      Case{"fsq_noise_dropout_5_3",
                           "fsq",
                           {"quantizer.fsq.preserve_symmetry=true", "quantizer.fsq.noise_dropout=0.5"},
                           {5, 3}},
                      Case{"vq_stochastic_codes_3_3_2",
                           "vq",
                           {"quantizer.vq.codebook_size=16", "quantizer.vq.stochastic_sample_codes=true"},
                           {3, 3, 2}},
                      Case{"lfq_entropy_subset_5_3",
                           "lfq",
                           {"quantizer.lfq.codebook_size=64", "quantizer.lfq.frac_per_sample_entropy=0.5"},
                           {5, 3}},
                      Case{"lfq_3_3_2", "lfq", {"quantizer.lfq.codebook_size=64"}, {3, 3, 2}},
                      Case{"residual_vq_dropout_5_3",
                           "residual-vq",
                           {"quantizer.vq.codebook_size=16", "quantizer.residual.num_quantizers=3",
                            "quantizer.residual.quantize_dropout=true", "quantizer.vq.threshold_ema_dead_code=1.0"},
                           {5, 3}},
                      Case{"residual_lfq_3_3_2",
                           "residual-lfq",
                           {"quantizer.lfq.codebook_size=16", "quantizer.residual.num_quantizers=2"},
                           {3, 3, 2}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace lockstep::dist
