#include "dist/predictor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lockstep::dist {
namespace {

// A call as its fingerprint sees it: `tag` tells calls apart, `step` is its declared training step.
CollectiveCall call(uint64_t sequence, const std::string& tag, int64_t step = 0, bool watched = true) {
  static std::vector<std::string> tags;  // CallSite holds a pointer: the strings outlive the calls
  tags.push_back(tag);
  CollectiveCall c;
  c.sequence = sequence;
  c.op = CollectiveOp::AllReduce;
  c.tensors = {TensorSpec{"float32", {4}}};
  c.site = CallSite{tags.back().c_str(), "a.cpp", 1};
  c.phase = step > 0 ? Phase::train_step(step) : Phase{};
  c.watched = watched;
  return c;
}

// A DDP-like step: four equal buckets, then another collective. Nothing is predicted before the
// calls repeated for a whole period and kMinRun calls (four equal buckets are not a period of one);
// from then on every call is, with its own sequence number.
TEST(Predictor, PredictsARepeatingStepOnceItRepeatedForAPeriod) {
  Predictor p;
  uint64_t sequence = 0;
  size_t predicted = 0, first_predicted = 0;
  for (int step = 1; step <= 6; ++step) {
    for (const char* tag : {"bucket", "bucket", "bucket", "bucket", "stats"}) {
      const CollectiveCall c = call(++sequence, tag);
      const auto expected = p.expect(sequence);
      if (expected) {
        EXPECT_EQ(*expected, c.fingerprint()) << "call " << sequence;
        if (predicted++ == 0) first_predicted = sequence;
      }
      p.record(c.fingerprint());
    }
  }
  EXPECT_EQ(first_predicted, 14u);  // calls 6 to 13 repeated the five before them
  EXPECT_EQ(predicted, 17u);        // and every call from the 14th to the 30th
}

// The trainer declares "train step t" around each step: its calls repeat with the step moving on.
TEST(Predictor, PredictsTheDeclaredStepMovingOnWithEachPeriod) {
  Predictor p;
  uint64_t sequence = 0;
  for (int step = 1; step <= 6; ++step) {
    for (const char* tag : {"grads", "codebook"}) p.record(call(++sequence, tag, step).fingerprint());
  }
  const auto expected = p.expect(sequence + 1);
  ASSERT_TRUE(expected.has_value());
  EXPECT_EQ(*expected, call(sequence + 1, "grads", 7).fingerprint());
  EXPECT_NE(*expected, call(sequence + 1, "grads", 6).fingerprint());
}

// A call that breaks the repetition ends the prediction until the calls repeat again; a barrier (whose
// exchange is the barrier) and a call whose waiter does not watch it (its caller runs the collective)
// are never predicted.
TEST(Predictor, ABrokenRepetitionOrAnUnwatchedCallIsNotPredicted) {
  Predictor p;
  uint64_t sequence = 0;
  for (int i = 0; i < 12; ++i) p.record(call(++sequence, "same").fingerprint());
  ASSERT_TRUE(p.expect(sequence + 1).has_value());
  p.record(call(++sequence, "evaluation").fingerprint());
  EXPECT_FALSE(p.expect(sequence + 1).has_value());
  // The same calls again: period 1 is trusted again after kMinRun of them, although period 13 (the
  // calls 13 before match, but for the evaluation's) has the longer run, not trusted yet.
  for (size_t i = 0; i < Predictor::kMinRun + 1; ++i) p.record(call(++sequence, "same").fingerprint());
  const auto again = p.expect(sequence + 1);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, call(sequence + 1, "same").fingerprint());

  Predictor barriers;
  for (uint64_t s = 1; s <= 12; ++s) {
    CollectiveCall b = call(s, "barrier");
    b.op = CollectiveOp::Barrier;
    barriers.record(b.fingerprint());
  }
  EXPECT_FALSE(barriers.expect(13).has_value());

  Predictor unwatched;
  for (uint64_t s = 1; s <= 12; ++s) unwatched.record(call(s, "foreign", 0, false).fingerprint());
  EXPECT_FALSE(unwatched.expect(13).has_value());
}

}  // namespace
}  // namespace lockstep::dist
