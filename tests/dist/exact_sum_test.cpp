#include "lockstep/dist/exact_sum.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <vector>

#include "dist/rank_threads.h"
#include "lockstep/core/error.h"

namespace lockstep::dist {
namespace {

using test_util::Join;

const std::vector<std::vector<int64_t>> kShapes{{3, 4}, {}};
constexpr int64_t kPieces = 12;

// Piece i: values of magnitudes from 1e-4 to 1e6 and both signs, so that float32 sums of them
// depend on the order they are added in.
std::vector<at::Tensor> piece(int64_t i) {
  const at::Generator g = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + i));
  const at::Tensor scales = torch::pow(10.0, torch::randint(-4, 7, {12}, g, torch::kFloat64));
  const at::Tensor values = (torch::randn({12}, g, torch::kFloat64) * scales).to(torch::kFloat32);
  return {values.reshape({3, 4}), torch::tensor(static_cast<float>(i) / 3.0f)};
}

// Pieces `order` split over ranks by `sizes` (rank r adds the next sizes[r] of them, in `order`),
// summed by ExactSum; rank 0's result, after checking every rank got the same bits.
std::vector<at::Tensor> summed(const std::vector<int64_t>& order, const std::vector<int64_t>& sizes, Join join) {
  const int ranks = static_cast<int>(sizes.size());
  std::vector<std::vector<at::Tensor>> results(static_cast<size_t>(ranks));
  const auto errors = test_util::run_ranks(
      ranks,
      [&](Group& g, int r) {
        ExactSum sum(std::shared_ptr<Group>(&g, [](Group*) {}), kShapes, kPieces);
        int64_t first = 0;
        for (int q = 0; q < r; ++q) first += sizes[static_cast<size_t>(q)];
        for (int64_t k = first; k < first + sizes[static_cast<size_t>(r)]; ++k) sum.add(piece(order[k]));
        results[static_cast<size_t>(r)] = sum.finish(LOCKSTEP_CALL_SITE("test.exact_sum"));
      },
      join);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(errors[r], nullptr) << test_util::message_of<std::exception>(errors[r]);
  }
  for (int r = 1; r < ranks && !errors[0] && !errors[r]; ++r) {
    for (size_t t = 0; t < kShapes.size(); ++t) EXPECT_TRUE(results[r][t].equal(results[0][t])) << "rank " << r;
  }
  return results[0];
}

std::vector<int64_t> in_order() {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < kPieces; ++i) order.push_back(i);
  return order;
}

TEST(ExactSum, TheSameBitsWhateverTheRanksAndTheOrder) {
  std::vector<int64_t> reversed = in_order();
  std::reverse(reversed.begin(), reversed.end());
  // The float64 sum the result rounds: within float32 rounding of it.
  at::Tensor exact = torch::zeros({3, 4}, torch::kFloat64);
  for (int64_t i = 0; i < kPieces; ++i) exact += piece(i)[0].to(torch::kFloat64);
  // The data is order-sensitive: float32 sums in two orders differ.
  at::Tensor forward = torch::zeros({3, 4}), backward = torch::zeros({3, 4});
  for (int64_t i = 0; i < kPieces; ++i) {
    forward += piece(i)[0];
    backward += piece(kPieces - 1 - i)[0];
  }
  ASSERT_FALSE(forward.equal(backward)) << "the pieces should make float32 sums depend on their order";

  for (const Join join : {Join::InMemory, Join::Gloo}) {
    SCOPED_TRACE(test_util::join_name(join));
    const std::vector<at::Tensor> one = summed(in_order(), {kPieces}, join);
    EXPECT_TRUE(torch::allclose(one[0].to(torch::kFloat64), exact, 1e-6, 1e-6));
    EXPECT_FLOAT_EQ(one[1].item<float>(), 22.0f);  // (0 + 1 + ... + 11) / 3
    for (const auto& [order, sizes] :
         {std::pair{in_order(), std::vector<int64_t>{kPieces}}, std::pair{reversed, std::vector<int64_t>{kPieces}},
          std::pair{in_order(), std::vector<int64_t>{5, 5, 2}}, std::pair{reversed, std::vector<int64_t>{1, 11}},
          std::pair{in_order(), std::vector<int64_t>{3, 3, 3, 3}}}) {
      const std::vector<at::Tensor> other = summed(order, sizes, join);
      for (size_t t = 0; t < kShapes.size(); ++t) {
        EXPECT_TRUE(other[t].equal(one[t])) << sizes.size() << " ranks, tensor " << t;
      }
    }
  }
}

TEST(ExactSum, AValueThatIsNotFiniteMakesItsTensorNanOnEveryRank) {
  std::vector<std::vector<at::Tensor>> results(2);
  const auto errors = test_util::run_ranks(
      2,
      [&](Group& g, int r) {
        ExactSum sum(std::shared_ptr<Group>(&g, [](Group*) {}), kShapes, 4);
        std::vector<at::Tensor> p = piece(r);
        if (r == 1) p[0][1][2] = std::nanf("");
        sum.add(p);
        sum.add({at::Tensor(), torch::tensor(1.0f)});  // an undefined tensor counts as zeros
        results[static_cast<size_t>(r)] = sum.finish(LOCKSTEP_CALL_SITE("test.exact_sum"));
      },
      Join::InMemory);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], nullptr) << test_util::message_of<std::exception>(errors[r]);
    EXPECT_TRUE(torch::isnan(results[r][0]).all().item<bool>()) << "rank " << r;
    EXPECT_FLOAT_EQ(results[r][1].item<float>(), 0.0f + 1.0f / 3.0f + 2.0f);
  }
}

// Tensors whose largest values are tiny (a scale of 2^200) or near float32's largest (2^-64): the
// sums are the float64 sums rounded, on a rank with pieces and on one without.
TEST(ExactSum, SumsTinyAndHugeValuesAndARankWithoutPieces) {
  const std::vector<std::vector<int64_t>> shapes{{3}, {2}};
  const std::vector<at::Tensor> a{torch::tensor({3e-40f, -1e-40f, 0.0f}), torch::tensor({1e38f, -3e38f})};
  const std::vector<at::Tensor> b{torch::tensor({1e-45f, 2e-40f, -5e-41f}), torch::tensor({2e38f, 1e38f})};
  std::vector<std::vector<at::Tensor>> results(3);
  const auto errors = test_util::run_ranks(
      3,
      [&](Group& g, int r) {
        ExactSum sum(std::shared_ptr<Group>(&g, [](Group*) {}), shapes, 2);
        if (r == 0) sum.add(a);
        if (r == 2) sum.add(b);
        results[static_cast<size_t>(r)] = sum.finish(LOCKSTEP_CALL_SITE("test.exact_sum"));
      },
      Join::InMemory);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(errors[r], nullptr) << test_util::message_of<std::exception>(errors[r]);
    for (size_t t = 0; t < shapes.size(); ++t) {
      const at::Tensor expected = (a[t].to(torch::kFloat64) + b[t].to(torch::kFloat64)).to(torch::kFloat32);
      EXPECT_TRUE(results[r][t].equal(expected)) << "rank " << r << ", tensor " << t << ": " << results[r][t];
    }
  }
}

TEST(ExactSum, RefusesMorePiecesThanItLeftRoomFor) {
  const auto errors = test_util::run_ranks(
      1,
      [&](Group& g, int) {
        ExactSum sum(std::shared_ptr<Group>(&g, [](Group*) {}), kShapes, 1);
        sum.add(piece(0));
        sum.add(piece(1));
      },
      Join::InMemory);
  EXPECT_NE(test_util::message_of<InvalidArgument>(errors[0]).find("more than the 1 pieces it was made for"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::dist
