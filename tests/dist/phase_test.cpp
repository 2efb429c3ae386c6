// G1 across phases: a collective issued from another phase must not pair with a training step's,
// even when sequence number, op, shapes and tag all agree.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/core/error.h"
#include "lockstep/dist/collective.h"
#include "lockstep/dist/group_reducer.h"
#include "lockstep/quant/registry.h"
#include "lockstep/train/config.h"
#include "lockstep/train/model_factory.h"
#include "rank_threads.h"

namespace lockstep::dist {
namespace {

std::shared_ptr<quant::Quantizer> build(const std::string& name, const std::vector<std::string>& settings) {
  train::Config config(train::lockstep_schema());
  for (const auto& s : settings) config.set_from_string(s);
  torch::manual_seed(7);
  return quant::make_quantizer(name, train::quantizer_options(config, name));
}

struct PhaseCase {
  std::string name;
  std::string quantizer;
  std::vector<std::string> settings;
  std::string source;  // the quantizer's file, which the mismatch must name
};
void PrintTo(const PhaseCase& c, std::ostream* os) { *os << c.name; }

using Buffers = std::map<std::string, at::Tensor>;

Buffers copy_of_buffers(const quant::Quantizer& q) {
  Buffers out;
  for (const auto& b : q.named_buffers()) out[b.key()] = b.value().clone();
  return out;
}

void expect_unchanged(const Buffers& before, const Buffers& after, int rank) {
  for (const auto& [name, value] : before) {
    EXPECT_TRUE(torch::equal(after.at(name), value)) << "rank " << rank << ": " << name << " changed";
  }
}

// The case's quantizer for each of two ranks, built one after another (construction draws from
// torch's default generator, which rank threads building at once would share).
std::vector<std::shared_ptr<quant::Quantizer>> two_quantizers(const PhaseCase& c) {
  return {build(c.quantizer, c.settings), build(c.quantizer, c.settings)};
}

class Phases : public ::testing::TestWithParam<PhaseCase> {};

// Failure mode a at its most treacherous: after step 7 rank 0 runs a training-mode forward to
// "validate" (declared as evaluation) while rank 1 runs step 8. Their first statistics collectives
// are identical but for the phase: without it they would pair, and rank 1's codebook would absorb
// rank 0's validation batch. Every rank must raise CollectiveMismatch naming both phases, and no
// quantizer state may change.
TEST_P(Phases, AForwardFromAnotherPhaseIsAMismatchBeforeAnyDataMoves) {
  const PhaseCase& c = GetParam();
  const auto quantizers = two_quantizers(c);
  std::vector<std::string> messages(2);
  std::vector<Buffers> before(2), after(2);
  const auto errors = test_util::run_ranks(2, [&](Group& g, int r) {
    auto& q = *quantizers[r];
    GroupReducer reducer(std::shared_ptr<Group>(&g, [](Group*) {}));
    const at::Tensor x = torch::randn({4, 6, q.dim()}, at::detail::createCPUGenerator(r));
    {
      const PhaseScope step7(g, Phase::train_step(7));
      q.quantize(x, {&reducer, at::detail::createCPUGenerator(7)});
    }
    before[r] = copy_of_buffers(q);
    const PhaseScope phase(g, r == 0 ? Phase::evaluation(7) : Phase::train_step(8));
    try {
      q.quantize(x, {&reducer, at::detail::createCPUGenerator(8)});
    } catch (const CollectiveMismatch& e) {
      messages[r] = e.what();
    }
    after[r] = copy_of_buffers(q);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << test_util::message_of<std::exception>(errors[r]);
    EXPECT_NE(messages[r].find("rank 0: #"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("in evaluation after step 7"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("in train step 8"), std::string::npos) << messages[r];
    // The call site is the quantizer's own line, not the reducer's that forwards it.
    EXPECT_NE(messages[r].find("src/quant/" + c.source + ":"), std::string::npos) << messages[r];
    EXPECT_EQ(messages[r].find("group_reducer.cpp"), std::string::npos) << messages[r];
    expect_unchanged(before[r], after[r], r);
  }
}

// A library user who never declared a phase: on several ranks the first statistics collective is
// refused on every rank, naming the quantizer's call site and PhaseScope, before any data moves
// (so a forward run on one rank only can never pair with another rank's step). One rank needs none.
TEST_P(Phases, AnUndeclaredPhaseIsRefusedOnEveryRankBeforeAnythingMoves) {
  const PhaseCase& c = GetParam();
  const auto quantizers = two_quantizers(c);
  std::vector<std::string> messages(2);
  std::vector<Buffers> before(2), after(2);
  const auto errors = test_util::run_ranks(2, [&](Group& g, int r) {
    auto& q = *quantizers[r];
    GroupReducer reducer(std::shared_ptr<Group>(&g, [](Group*) {}));
    before[r] = copy_of_buffers(q);
    try {
      q.quantize(torch::randn({4, 6, q.dim()}, at::detail::createCPUGenerator(r)),
                 {&reducer, at::detail::createCPUGenerator(7)});
    } catch (const InvalidArgument& e) {
      messages[r] = e.what();
    }
    after[r] = copy_of_buffers(q);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << test_util::message_of<std::exception>(errors[r]);
    EXPECT_NE(messages[r].find("on rank " + std::to_string(r) + " of 2 are summed in no declared phase"),
              std::string::npos)
        << messages[r];
    EXPECT_NE(messages[r].find("src/quant/" + c.source + ":"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("PhaseScope"), std::string::npos) << messages[r];
    expect_unchanged(before[r], after[r], r);
  }
  // One process: nothing to pair with, so no phase is needed.
  auto single = build(c.quantizer, c.settings);
  GroupReducer alone(make_single_process_group());
  EXPECT_NO_THROW(single->quantize(torch::randn({4, 6, single->dim()}), {&alone, at::detail::createCPUGenerator(7)}));
}

INSTANTIATE_TEST_SUITE_P(Quantizers, Phases,
                         ::testing::Values(PhaseCase{"vq", "vq", {"quantizer.vq.codebook_size=16"}, "vq_updates.cpp"},
                                           PhaseCase{"lfq", "lfq", {"quantizer.lfq.codebook_size=64"}, "lfq.cpp"},
                                           PhaseCase{
                                               "residual_vq",
                                               "residual-vq",
                                               {"quantizer.vq.codebook_size=16", "quantizer.residual.num_quantizers=2"},
                                               "vq_updates.cpp"}),
                         [](const ::testing::TestParamInfo<PhaseCase>& info) { return info.param.name; });

TEST(Phase, IsPartOfTheFingerprintAndTheDescription) {
  const CallSite site{"vq.ema", "vq.cpp", 1};
  const auto a = CollectiveCall::of(3, CollectiveOp::AllReduce, {torch::ones({4})}, site, Phase::train_step(8));
  const auto b = CollectiveCall::of(3, CollectiveOp::AllReduce, {torch::ones({4})}, site, Phase::evaluation(8));
  const auto c = CollectiveCall::of(3, CollectiveOp::AllReduce, {torch::ones({4})}, site, Phase::train_step(9));
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  EXPECT_NE(a.fingerprint(), c.fingerprint());
  EXPECT_EQ(
      a.fingerprint(),
      CollectiveCall::of(3, CollectiveOp::AllReduce, {torch::ones({4})}, site, Phase::train_step(8)).fingerprint());
  EXPECT_NE(a.describe().find("at vq.ema (vq.cpp:1) in train step 8"), std::string::npos) << a.describe();
  EXPECT_NE(CollectiveCall::of(1, CollectiveOp::Barrier, {}, site, {}).describe().find("in no declared phase"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::dist
