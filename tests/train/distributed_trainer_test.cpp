// The trainer on ranks run as threads of this test: what must agree across ranks is checked.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "data/idx_writer.h"
#include "dist/rank_threads.h"
#include "io/test_temp_dir.h"
#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/dist/collective.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/train/trainer.h"
#include "train/small_run.h"

#if LOCKSTEP_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#endif

namespace lockstep::train {
namespace {

Config tiny(int64_t steps) {
  ::lockstep::test_util::SmallRun r;
  r.steps = steps;
  r.train_images = 64;
  r.test_images = 16;
  r.channels = {4, 4};
  r.batch = 8;
  r.grid_images = 2;
  r.no_checkpoints = false;
  return ::lockstep::test_util::small_run(r);
}

// The tensors of a run directory's checkpoint, as bytes.
std::map<std::string, std::string> checkpoint_bytes(const std::string& run_dir) {
  std::map<std::string, std::string> out;
  for (const auto& [name, t] : io::load_safetensors(run_dir + "/checkpoint.safetensors").tensors) out[name] = t.bytes;
  return out;
}

// train.shard_size = 1: 3 ranks holding 3, 3 and 2 of 8 images train VQ with dead codes and sampled
// codes to one process's checkpoint bit for bit (model, optimizer and codebooks); shards of 2 (4 shards on 3
// ranks: 4, 2 and 2 images) likewise. Both resume one run after its first step (k-means): rank
// threads build their models from one global generator at once, so a new run's rank 0 would not
// start from one process's weights (tests/cli/scenarios.py runs processes from step 0).
TEST(DistributedTrainer, UnevenRanksInShardsTrainOneProcessesRunBitForBit) {
  for (const int64_t shard : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "train.shard_size = " << shard);
    ::lockstep::test_util::TempDir tmp;
    Config c = tiny(1);
    c.set("quantizer.name", std::string("vq"));
    c.set("quantizer.vq.kmeans_init", true);
    c.set("quantizer.vq.threshold_ema_dead_code", 1.0);
    c.set("quantizer.vq.stochastic_sample_codes", true);  // per-token draws keyed by global position
    c.set("train.shard_size", shard);
    Trainer::create(c, tmp.file("one"), dist::make_single_process_group())->run({});
    std::filesystem::copy(tmp.file("one"), tmp.file("three"));
    Trainer::resume(tmp.file("one"), {"train.steps=6"}, dist::make_single_process_group())->run({});
    const auto errors = dist::test_util::run_ranks(3, [&](dist::Group& g, int) {
      Trainer::resume(tmp.file("three"), {"train.steps=6"}, std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}))
          ->run({});
    });
    for (int r = 0; r < 3; ++r) ASSERT_FALSE(errors[r]) << dist::test_util::message_of<std::exception>(errors[r]);
    const auto one = checkpoint_bytes(tmp.file("one")), three = checkpoint_bytes(tmp.file("three"));
    ASSERT_FALSE(one.empty());
    for (const auto& [name, bytes] : one) EXPECT_TRUE(three.count(name) && three.at(name) == bytes) << name;
  }
}

// A quantizer whose forward takes statistics of the whole batch (LFQ's entropy) is refused in
// shards, by name, on every rank, at the first step.
TEST(DistributedTrainer, ShardsRefuseAQuantizerThatTakesWholeBatchStatistics) {
  ::lockstep::test_util::TempDir tmp;
  std::vector<std::string> messages(2);
  const auto errors = dist::test_util::run_ranks(2, [&](dist::Group& g, int r) {
    Config c = tiny(2);
    c.set("quantizer.name", std::string("lfq"));
    c.set("train.shard_size", int64_t{2});
    try {
      Trainer::create(c, tmp.file("run"), std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}))->run({});
    } catch (const InvalidArgument& e) {
      messages[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << dist::test_util::message_of<std::exception>(errors[r]);
    EXPECT_NE(messages[r].find("train.shard_size = 2: this quantizer's forward takes statistics of the whole batch"),
              std::string::npos)
        << "rank " << r << ": " << messages[r];
  }
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
    // The key is named (the only one that differs), on every rank.
    EXPECT_NE(messages[r].find("the configuration of rank(s) 1 differs from rank 0's in train.lr (rank 1) ("),
              std::string::npos)
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

// A Fashion-MNIST-shaped directory of 64 training and 16 test images whose pixels depend on `salt`;
// the test images are `test_side` pixels square.
std::string fake_fashion_mnist(const ::lockstep::test_util::TempDir& tmp, const std::string& name, int salt,
                               uint32_t test_side = 28) {
  namespace tu = ::lockstep::test_util;
  const std::string dir = tmp.file(name);
  std::filesystem::create_directories(dir);
  for (const auto& [split, n] : {std::pair<std::string, uint32_t>{"train", 64}, {"t10k", 16}}) {
    const uint32_t side = split == "train" ? 28 : test_side;
    std::string pixels(static_cast<size_t>(n) * side * side, '\0');
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>((i * 7 + salt * 13) % 251);
    tu::write_gzip(dir + "/" + split + "-images-idx3-ubyte.gz", tu::make_idx({n, side, side}, pixels));
    tu::write_gzip(dir + "/" + split + "-labels-idx1-ubyte.gz", tu::make_idx({n}, std::string(n, '\1')));
  }
  return dir;
}

TEST(DistributedTrainer, RanksReadingDifferentImagesStopAtTheFirstEpoch) {
  ::lockstep::test_util::TempDir tmp;
  const std::vector<std::string> dirs = {fake_fashion_mnist(tmp, "a", 1), fake_fashion_mnist(tmp, "b", 2)};
  std::vector<std::string> messages(2);
  const auto errors = dist::test_util::run_ranks(2, [&](dist::Group& g, int r) {
    Config c = tiny(4);
    c.set("data.dir", dirs[r]);  // may differ between ranks (each node has its copy)...
    try {
      Trainer::create(c, tmp.file("run"), std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}))->run({});
      ADD_FAILURE() << "rank " << r << " trained on other images than rank 0";
    } catch (const dist::ReplicaDivergence& e) {
      messages[r] = e.what();  // ...but the images must be the same
      EXPECT_EQ(e.ranks(), std::vector<int>{1});
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << dist::test_util::message_of<std::exception>(errors[r]);
    EXPECT_NE(messages[r].find("epoch 0: the data plan of rank(s) 1 (8 steps over 64 images) differs from rank 0's "
                               "(8 steps over 64 images)"),
              std::string::npos)
        << messages[r];
  }
}

// Test images of another size than the training images would be evaluated as something else.
TEST(DistributedTrainer, TestImagesOfAnotherSizeAreRefusedBeforeTraining) {
  ::lockstep::test_util::TempDir tmp;
  Config c = tiny(4);
  c.set("data.dir", fake_fashion_mnist(tmp, "mixed", 1, /*test_side=*/32));
  try {
    Trainer::create(c, tmp.file("run"), dist::make_single_process_group());
    FAIL() << "trained with 28x28 training images and 32x32 test images";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("Fashion-MNIST's test images are 32x32 but its training images 28x28 ("),
              std::string::npos)
        << e.what();
  }
}

#if LOCKSTEP_HAVE_OPENCV
TEST(DistributedTrainer, RanksWithDifferentImageFoldersStopAtTheFirstEpoch) {
  ::lockstep::test_util::TempDir tmp;
  const std::vector<std::string> dirs = {tmp.file("a"), tmp.file("b")};
  for (const auto& dir : dirs) {
    std::filesystem::create_directories(dir);
    for (int i = 0; i < 16; ++i) {
      cv::imwrite(dir + "/" + std::to_string(i) + ".png", cv::Mat(16, 16, CV_8UC3, cv::Scalar(i, 2 * i, 3 * i)));
    }
  }
  cv::imwrite(dirs[1] + "/extra.png", cv::Mat(16, 16, CV_8UC3, cv::Scalar(5, 5, 5)));  // only on rank 1's node
  std::vector<std::string> messages(2);
  const auto errors = dist::test_util::run_ranks(2, [&](dist::Group& g, int r) {
    Config c = tiny(4);
    c.set("data.dir", dirs[r]);
    c.set("data.buckets", std::string("16x16"));
    c.set("data.eval_images", int64_t{2});
    c.set("train.batch_size", int64_t{4});
    try {
      Trainer::create(c, tmp.file("run"), std::shared_ptr<dist::Group>(&g, [](dist::Group*) {}))->run({});
      ADD_FAILURE() << "rank " << r << " trained on another folder than rank 0";
    } catch (const dist::ReplicaDivergence& e) {
      messages[r] = e.what();
      EXPECT_EQ(e.ranks(), std::vector<int>{1});
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << dist::test_util::message_of<std::exception>(errors[r]);
    EXPECT_NE(messages[r].find("epoch 0: the data plan of rank(s) 1 (3 steps over 15 images) differs from rank 0's "
                               "(3 steps over 14 images)"),
              std::string::npos)
        << messages[r];
  }
}
#endif

}  // namespace
}  // namespace lockstep::train
