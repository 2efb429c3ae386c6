// The trainer on ranks run as threads of this test: what must agree across ranks is checked.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist/rank_threads.h"
#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

Config tiny(int64_t steps) {
  Config c(lockstep_schema());
  c.set("data.dir", std::string(LOCKSTEP_FASHION_MNIST_DIR));
  c.set("data.train_subset", int64_t{64});
  c.set("data.test_subset", int64_t{16});
  c.set("model.channels", std::vector<int64_t>{4, 4});
  c.set("train.batch_size", int64_t{8});
  c.set("train.steps", steps);
  c.set("train.threads", int64_t{1});
  c.set("eval.grid_images", int64_t{2});
  return c;
}

TEST(DistributedTrainer, RanksStartedWithDifferentSettingsAreToldBeforeTraining) {
  ::lockstep::test_util::TempDir tmp;
  std::vector<std::string> messages(2);
  const auto errors = dist::test_util::run_ranks(2, [&](dist::Group& g, int r) {
    Config c = tiny(4);
    if (r == 1) c.set("train.lr", 0.5);  // a typo on one rank's command line
    try {
      Trainer::create(c, tmp.file("run"), std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}));
      ADD_FAILURE() << "rank " << r << " accepted a different configuration";
    } catch (const InvalidArgument& e) {
      messages[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << dist::test_util::message_of<std::exception>(errors[r]);
    EXPECT_NE(messages[r].find("the configuration of rank(s) 1 differs from rank 0's"), std::string::npos)
        << messages[r];
  }
}

TEST(DistributedTrainer, BatchesSmallerThanTheRankCountAreRefused) {
  ::lockstep::test_util::TempDir tmp;
  std::vector<std::string> messages(3);
  dist::test_util::run_ranks(3, [&](dist::Group& g, int r) {
    Config c = tiny(4);
    c.set("train.batch_size", int64_t{2});
    try {
      Trainer::create(c, tmp.file("run"), std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}));
    } catch (const InvalidArgument& e) {
      messages[r] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(messages[r].find("train.batch_size = 2 is the global batch"), std::string::npos) << messages[r];
  }
}

}  // namespace
}  // namespace lockstep::train
