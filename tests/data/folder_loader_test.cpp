// Batches from an image folder through the global plan: rank parts, buckets, prefetching in order,
// resume, and images that break after the manifest was built.
#include "lockstep/data/folder_loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/test_temp_dir.h"
#include "lockstep/config_build.h"
#include "lockstep/core/error.h"

#if LOCKSTEP_HAVE_OPENCV
#include <opencv2/imgcodecs.hpp>

namespace lockstep::data {
namespace {

// 12 square and 9 wide images (their pixels encode their number), and one corrupt file.
std::string make_folder(const test_util::TempDir& tmp) {
  const std::string root = tmp.file("folder");
  std::filesystem::create_directories(root + "/wide");
  for (int i = 0; i < 12; ++i) {
    cv::imwrite(root + "/sq" + std::to_string(10 + i) + ".png", cv::Mat(64, 64, CV_8UC3, cv::Scalar(i * 10, 0, 0)));
  }
  for (int i = 0; i < 9; ++i) {
    cv::imwrite(root + "/wide/w" + std::to_string(i) + ".png", cv::Mat(64, 128, CV_8UC1, cv::Scalar(100 + i)));
  }
  std::ofstream(root + "/bad.png") << "not a png";
  return root;
}

PlanOptions plan_options(int64_t batch) {
  PlanOptions o;
  o.global_batch = batch;
  o.seed = 1;
  return o;
}

FolderDataset dataset(const std::string& root, int64_t batch = 4) {
  return FolderDataset(scan_image_folder(root), {{32, 32}, {64, 32}}, 3, plan_options(batch));
}

TEST(FolderLoader, RankPartsComeFromOneBucketAtTheBucketsSize) {
  test_util::TempDir tmp;
  const FolderDataset data = dataset(make_folder(tmp));
  EXPECT_EQ(data.unreadable(), 1);
  ASSERT_EQ(data.buckets()[0].size(), 12u);
  ASSERT_EQ(data.buckets()[1].size(), 9u);
  const EpochPlan plan = data.plan(0);
  ASSERT_EQ(plan.steps(), 3 + 2);  // 9 wide images: 2 batches of 4, one left out
  for (int64_t s = 0; s < plan.steps(); ++s) {
    int64_t images = 0;
    for (int r = 0; r < 3; ++r) {
      const FolderBatch b = data.load(plan, 0, s, 3, r);
      EXPECT_EQ(b.bucket, plan.batch(s).bucket);
      for (const auto& img : b.images) {
        EXPECT_EQ(img.width, b.size.width);
        EXPECT_EQ(img.height, b.size.height);
        EXPECT_EQ(img.channels, 3);
      }
      EXPECT_EQ(b.replaced, 0);
      images += static_cast<int64_t>(b.images.size());
    }
    EXPECT_EQ(images, 4);
  }
}

TEST(FolderLoader, PrefetchingGivesTheStepsInOrderAndResumesMidEpoch) {
  test_util::TempDir tmp;
  const FolderDataset data = dataset(make_folder(tmp));
  const EpochPlan plan = data.plan(2);
  PrefetchLoader loader(data, 2, 0, 2, 1, /*threads=*/2, /*depth=*/2);
  std::vector<FolderBatch> all;
  while (!loader.done()) all.push_back(loader.next());
  ASSERT_EQ(static_cast<int64_t>(all.size()), plan.steps());
  for (int64_t s = 0; s < plan.steps(); ++s) {
    EXPECT_EQ(all[s].step, s);
    const FolderBatch direct = data.load(plan, 2, s, 2, 1);
    ASSERT_EQ(all[s].images.size(), direct.images.size());
    for (size_t i = 0; i < direct.images.size(); ++i) EXPECT_EQ(all[s].images[i].pixels, direct.images[i].pixels);
  }
  PrefetchLoader resumed(data, 2, 3, 2, 1);
  const FolderBatch third = resumed.next();
  EXPECT_EQ(third.step, 3);
  EXPECT_EQ(third.images[0].pixels, all[3].images[0].pixels);
}

TEST(FolderLoader, AnEndStepStopsTheLoaderBeforeTheEpochEnds) {
  test_util::TempDir tmp;
  const FolderDataset data = dataset(make_folder(tmp));
  ASSERT_EQ(data.plan(0).steps(), 5);
  PrefetchLoader loader(data, 0, 1, 1, 0, /*threads=*/2, /*depth=*/4, /*end_step=*/3);
  EXPECT_EQ(loader.next().step, 1);
  EXPECT_EQ(loader.next().step, 2);
  EXPECT_TRUE(loader.done());
  EXPECT_THROW(loader.next(), InvalidArgument);
}

TEST(FolderLoader, AnImageThatBreaksAfterTheManifestIsReplacedTheSameWayEveryTime) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp);
  const FolderDataset data = dataset(root);
  // Break half the square images after the manifest was built.
  for (int i = 0; i < 12; i += 2) std::ofstream(root + "/sq" + std::to_string(10 + i) + ".png") << "truncated";
  const EpochPlan plan = data.plan(0);
  int64_t replaced = 0;
  for (int64_t s = 0; s < plan.steps(); ++s) {
    if (plan.batch(s).bucket != 0) continue;
    for (int r = 0; r < 2; ++r) {
      const FolderBatch a = data.load(plan, 0, s, 2, r);
      const FolderBatch b = data.load(plan, 0, s, 2, r);
      EXPECT_EQ(a.replaced, b.replaced);
      for (size_t i = 0; i < a.images.size(); ++i) EXPECT_EQ(a.images[i].pixels, b.images[i].pixels);
      replaced += a.replaced;
    }
  }
  EXPECT_GT(replaced, 0);
}

TEST(FolderLoader, ImpossibleSettingsFailBeforeTraining) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp);
  try {
    dataset(root, 13);
    FAIL() << "accepted a batch no bucket fills";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no bucket can fill one global batch of 13 images; the fullest, 32x32, "
                                         "holds 12 of the 21 training images"),
              std::string::npos)
        << e.what();
  }
  const std::string empty = tmp.file("empty");
  std::filesystem::create_directories(empty);
  std::ofstream(empty + "/x.png") << "junk";
  try {
    FolderDataset(scan_image_folder(empty), {{32, 32}}, 3, plan_options(1));
    FAIL() << "accepted a folder without a readable image";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("holds no readable image (1 image files listed"), std::string::npos)
        << e.what();
  }
}

TEST(FolderLoader, ABucketThatCannotFillABatchJoinsTheNearestFullOne) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp);
  // Three buckets: square (12 images), 2:1 (9) and 3:2, which the 2:1 images are nearer to but which
  // holds none; with batches of 10 only the square bucket is full, so the wide images go there.
  const FolderDataset data(scan_image_folder(root), {{32, 32}, {64, 32}, {48, 32}}, 3, plan_options(10));
  ASSERT_EQ(data.merged().size(), 1u);
  EXPECT_EQ(data.merged()[0].from, 1);
  EXPECT_EQ(data.merged()[0].to, 0);
  EXPECT_EQ(data.merged()[0].images, 9);
  EXPECT_EQ(data.buckets()[0].size(), 21u);
  EXPECT_TRUE(data.buckets()[1].empty());
  const EpochPlan plan = data.plan(0);
  ASSERT_EQ(plan.steps(), 2);
  for (int64_t s = 0; s < plan.steps(); ++s) {
    for (const auto& img : data.load(plan, 0, s, 1, 0).images) {
      EXPECT_EQ(img.width, 32);
      EXPECT_EQ(img.height, 32);
    }
  }
  // With batches of 4 both are full and nothing moves; the nearer of two full buckets is chosen.
  EXPECT_TRUE(dataset(root, 4).merged().empty());
  const FolderDataset three(scan_image_folder(root), {{32, 32}, {64, 32}, {48, 32}}, 3, plan_options(4));
  EXPECT_TRUE(three.merged().empty());
  EXPECT_EQ(three.buckets()[1].size(), 9u);
}

// Crops and flips are drawn per slot of the global batch: 1 rank and 2 ranks load the same images,
// a second load of the step repeats them, and another epoch draws anew.
TEST(FolderLoader, AugmentationIsDrawnPerSlotTheSameOnAnyNumberOfRanks) {
  test_util::TempDir tmp;
  const std::string root = tmp.file("textured");
  std::filesystem::create_directories(root);
  for (int i = 0; i < 8; ++i) {
    cv::Mat m(32, 48, CV_8UC1);
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 48; ++x) m.at<uint8_t>(y, x) = static_cast<uint8_t>(5 * x + y + i);
    }
    cv::imwrite(root + "/t" + std::to_string(i) + ".png", m);
  }
  Augmentation augmentation;
  augmentation.flip = true;
  augmentation.max_zoom = 1.5;
  const FolderDataset plain(scan_image_folder(root), {{24, 24}}, 1, plan_options(4));
  const FolderDataset augmented(scan_image_folder(root), {{24, 24}}, 1, plan_options(4), {}, augmentation);
  const EpochPlan plan = augmented.plan(0);
  const FolderBatch whole = augmented.load(plan, 0, 0, 1, 0);
  std::vector<io::Image> parts = augmented.load(plan, 0, 0, 2, 0).images;
  for (const auto& image : augmented.load(plan, 0, 0, 2, 1).images) parts.push_back(image);
  ASSERT_EQ(parts.size(), whole.images.size());
  int changed = 0;
  const FolderBatch centred = plain.load(plain.plan(0), 0, 0, 1, 0);
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].pixels, whole.images[i].pixels) << "slot " << i;
    EXPECT_EQ(augmented.load(plan, 0, 0, 1, 0).images[i].pixels, whole.images[i].pixels) << "slot " << i;
    changed += whole.images[i].pixels != centred.images[i].pixels;
  }
  EXPECT_GT(changed, 0);
  EXPECT_NE(augmentation.draw(1, 0, 0, 0).x, augmentation.draw(1, 1, 0, 0).x);  // another epoch, another draw
  int flipped = 0;
  for (int64_t slot = 0; slot < 200; ++slot) flipped += augmentation.draw(1, 0, 0, slot).flip;
  EXPECT_GT(flipped, 70);
  EXPECT_LT(flipped, 130);
}

TEST(FolderLoader, ExcludedImagesAreNeverLoadedNorUsedAsReplacements) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp);
  const Manifest m = scan_image_folder(root);
  const std::vector<int64_t> held = held_out_entries(m, 5);
  const FolderDataset data(m, {{32, 32}, {64, 32}}, 3, plan_options(4), held);
  EXPECT_EQ(data.training_images(), 21 - 5);
  for (const auto& members : data.buckets()) {
    for (int64_t id : members) EXPECT_EQ(std::count(held.begin(), held.end(), id), 0) << id;
  }
}

}  // namespace
}  // namespace lockstep::data
#endif  // LOCKSTEP_HAVE_OPENCV
