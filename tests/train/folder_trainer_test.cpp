// Training on an image folder: buckets of several sizes, the run's manifest, held-out evaluation,
// exact resume, a folder that changed, and images that break during training. The images are
// written here with OpenCV (none are committed).
#include "lockstep/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "io/test_temp_dir.h"
#include "lockstep/config_build.h"
#include "lockstep/core/error.h"
#include "lockstep/data/image_folder.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/metrics.h"
#include "lockstep/train/run_dir.h"
#include "train/small_run.h"

#if LOCKSTEP_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

namespace lockstep::train {
namespace {
namespace fs = std::filesystem;

// 20 square images, 14 wide (2:1) and 3 tall (1:2; too few for a batch of 8), of varied sizes and
// smooth random content, and one file that is not an image at all.
std::string make_folder(const test_util::TempDir& tmp, const std::string& name = "images") {
  const std::string root = tmp.file(name);
  fs::create_directories(root + "/wide");
  cv::RNG rng(7);
  auto image = [&](int h, int w) {  // a random colour gradient
    const double base[3] = {rng.uniform(0., 255.), rng.uniform(0., 255.), rng.uniform(0., 255.)};
    const double dx = rng.uniform(-2., 2.), dy = rng.uniform(-2., 2.);
    cv::Mat m(h, w, CV_8UC3);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        for (int c = 0; c < 3; ++c)
          m.at<cv::Vec3b>(y, x)[c] = cv::saturate_cast<uchar>(base[c] + (c + 1) * (dx * x + dy * y) / 3);
      }
    }
    return m;
  };
  for (int i = 0; i < 20; ++i) cv::imwrite(root + "/sq" + std::to_string(i) + ".png", image(40 + 4 * i, 40 + 4 * i));
  for (int i = 0; i < 14; ++i) cv::imwrite(root + "/wide/w" + std::to_string(i) + ".jpg", image(36, 72 + 2 * i));
  for (int i = 0; i < 3; ++i) cv::imwrite(root + "/t" + std::to_string(i) + ".png", image(64, 32));
  std::ofstream(root + "/notes.png") << "this is not a png";
  return root;
}

Config folder_config(const std::string& root, int64_t steps) {
  ::lockstep::test_util::SmallRun r;
  r.steps = steps;
  r.train_images = r.test_images = 0;  // the whole folder
  r.batch = 8;
  r.log_every = 2;
  Config c = ::lockstep::test_util::small_run(r, root);
  c.set("data.buckets", std::string("32x32,64x32,32x64"));
  c.set("data.eval_images", int64_t{4});
  return c;
}

std::shared_ptr<dist::Group> one() { return dist::make_single_process_group(); }

std::vector<MetricsRecord> records_of(const std::string& run, const std::string& kind) {
  std::vector<MetricsRecord> out;
  for (const auto& r : read_metrics(metrics_path(run))) {
    if (r.kind == kind) out.push_back(r);
  }
  return out;
}

double value_of(const MetricsRecord& r, const std::string& key) {
  for (const auto& [k, v] : r.values) {
    if (k == key) return v;
  }
  ADD_FAILURE() << r.kind << " record at step " << r.step << " has no " << key;
  return 0;
}

TEST(FolderTrainer, TrainsOnEveryBucketAndReportsTheDataEachEpoch) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp), run = tmp.file("run");
  std::vector<std::string> info;
  Config config = folder_config(root, 0);
  config.set("train.epochs", int64_t{3});
  auto trainer = Trainer::create(config, run, one(), [&](const std::string& s) { info.push_back(s); });
  // 37 readable images, 4 held out; the 3 tall ones join the square bucket: 33 in buckets of 8.
  ASSERT_FALSE(info.empty());
  EXPECT_NE(info.back().find("33 training images, 4 held out for evaluation, 1 unreadable"), std::string::npos)
      << info.back();
  EXPECT_NE(info.back().find("images of 32x64 join 32x32 (too few for one global batch)"), std::string::npos)
      << info.back();
  EXPECT_EQ(trainer->config().get_string("data.dataset"), "folder");  // "auto" resolved, and recorded
  std::set<std::pair<int64_t, int64_t>> sizes;                        // (width, height) of the steps
  TrainCallbacks cb;
  cb.on_step = [&](const StepReport& r) { sizes.emplace(r.image_width, r.image_height); };
  const TrainSummary s = trainer->run(cb);
  // Both buckets with images train (the tall ones at 32x32), and nothing else.
  EXPECT_EQ(sizes, (std::set<std::pair<int64_t, int64_t>>{{32, 32}, {64, 32}}));

  const auto epochs = records_of(run, "epoch");
  ASSERT_EQ(epochs.size(), 3u);
  const int64_t steps_per_epoch = epochs[0].step;
  EXPECT_GE(steps_per_epoch, 3);
  EXPECT_EQ(s.steps, 3 * steps_per_epoch);
  for (size_t e = 0; e < epochs.size(); ++e) {
    EXPECT_EQ(epochs[e].step, static_cast<int64_t>(e + 1) * steps_per_epoch);
    EXPECT_EQ(value_of(epochs[e], "unreadable"), 1);
    EXPECT_EQ(value_of(epochs[e], "replaced"), 0);
  }
  EXPECT_EQ(s.test.images, 4);
  EXPECT_GT(s.test.psnr_db, 5.0);
  // The run keeps the manifest it trained on, the unreadable file listed with its error.
  const data::Manifest m = data::load_manifest(manifest_path(run));
  EXPECT_EQ(m.entries.size(), 38u);
  EXPECT_EQ(m.readable_count(), 37);
  EXPECT_NE(io::read_file(config_path(run)).find("dataset = \"folder\""), std::string::npos);
}

// With random zoom-and-crop and flips: a resumed run draws what the uninterrupted one drew.
TEST(FolderTrainer, AResumedRunIsBitwiseTheUninterruptedOneAcrossEpochs) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp);
  Config config = folder_config(root, 11);
  config.set("data.random_flip", true);
  config.set("data.random_zoom", 1.5);
  Trainer::create(config, tmp.file("straight"), one())->run({});

  std::atomic<bool> stop{false};
  TrainCallbacks cb;
  cb.stop_requested = &stop;
  cb.on_step = [&](const StepReport& r) { stop = r.step == 4; };  // mid-epoch (3 per epoch): the loader ran ahead
  EXPECT_TRUE(Trainer::create(config, tmp.file("resumed"), one())->run(cb).interrupted);
  Trainer::resume(tmp.file("resumed"), {"data.workers=1", "data.prefetch=1"}, one())->run({});

  const Checkpoint a = load_checkpoint(checkpoint_path(tmp.file("straight")));
  const Checkpoint b = load_checkpoint(checkpoint_path(tmp.file("resumed")));
  EXPECT_EQ(b.step, 11);
  ASSERT_EQ(a.model.size(), b.model.size());
  for (const auto& [name, t] : a.model) EXPECT_TRUE(torch::equal(t, b.model.at(name))) << name;
  for (const auto& [name, t] : a.optimizer) EXPECT_TRUE(torch::equal(t, b.optimizer.at(name))) << name;
}

TEST(FolderTrainer, ResumeRefusesAFolderThatChangedButFollowsOneThatMoved) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp), run = tmp.file("run");
  Trainer::create(folder_config(root, 2), run, one())->run({});

  // Moved (data.dir may change on resume): the same files, so the same plan.
  fs::rename(root, tmp.file("moved"));
  EXPECT_NO_THROW(Trainer::resume(run, {"data.dir=" + tmp.file("moved"), "train.steps=3"}, one())->run({}));

  // Changed: one image added and one rewritten; the run cannot continue its sequence.
  cv::imwrite(tmp.file("moved") + "/extra.png", cv::Mat(40, 40, CV_8UC3, cv::Scalar(1, 2, 3)));
  cv::imwrite(tmp.file("moved") + "/sq3.png", cv::Mat(52, 52, CV_8UC3, cv::Scalar(9, 9, 9)));
  try {
    Trainer::resume(run, {"data.dir=" + tmp.file("moved"), "train.steps=4"}, one());
    FAIL() << "resumed on a changed folder";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("changed since the run started: 1 added (extra.png), 1 modified (sq3.png)"),
              std::string::npos)
        << e.what();
  }
}

TEST(FolderTrainer, ImagesThatBreakDuringTrainingAreReplacedAndCounted) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp), run = tmp.file("run");
  Config config = folder_config(root, 0);
  config.set("data.remainder", std::string("pad"));  // every training image is used each epoch
  auto trainer = Trainer::create(config, run, one());
  // Break three training images (not held out) after the manifest was built.
  const data::Manifest m = data::load_manifest(manifest_path(run));
  const std::vector<int64_t> held = data::held_out_entries(m, 4);
  int broken = 0;
  for (size_t i = 0; i < m.entries.size() && broken < 3; ++i) {
    if (!m.entries[i].readable() || std::count(held.begin(), held.end(), static_cast<int64_t>(i))) continue;
    std::ofstream(root + "/" + m.entries[i].path, std::ios::trunc) << "truncated";
    ++broken;
  }
  ASSERT_EQ(broken, 3);
  const TrainSummary s = trainer->run({});
  const auto epochs = records_of(run, "epoch");
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_EQ(epochs[0].step, s.steps);
  EXPECT_GE(value_of(epochs[0], "replaced"), 3);
}

TEST(FolderTrainer, SettingsThatCannotWorkFailBeforeTraining) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp);
  int runs = 0;
  auto error_of = [&](Config c) -> std::string {
    try {
      Trainer::create(c, tmp.file("run" + std::to_string(runs++)), one());
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  Config too_big = folder_config(root, 2);
  too_big.set("train.batch_size", int64_t{20});
  EXPECT_NE(error_of(too_big).find("no bucket can fill one global batch of 20 images; the fullest, 32x32, holds "),
            std::string::npos)
      << error_of(too_big);
  Config odd = folder_config(root, 2);
  odd.set("data.buckets", std::string("31x31,64x32"));
  EXPECT_NE(error_of(odd).find("training images of 31x31 cannot pass through the model's 2 levels: each side must "
                               "be a multiple of 2"),
            std::string::npos)
      << error_of(odd);
  // Every size of the table must suit the model, also one whose images join another bucket.
  Config merged_odd = folder_config(root, 2);
  merged_odd.set("data.buckets", std::string("32x32,64x32,31x62"));
  EXPECT_NE(error_of(merged_odd).find("training images of 31x62 cannot pass through"), std::string::npos)
      << error_of(merged_odd);
  // A table with two buckets of one aspect ratio is refused when it is set, whatever the dataset.
  Config twins = folder_config(root, 2);
  try {
    twins.set("data.buckets", std::string("32x32,64x64"));
    ADD_FAILURE() << "data.buckets = 32x32,64x64 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("(32x32) and 1 (64x64) have the same aspect ratio"), std::string::npos)
        << e.what();
  }
  Config all_held = folder_config(root, 2);
  all_held.set("data.eval_images", int64_t{37});
  EXPECT_NE(error_of(all_held).find("data.eval_images = 37 would hold out every one of the 37 readable images"),
            std::string::npos);
  const std::string empty = tmp.file("empty");
  fs::create_directories(empty);
  std::ofstream(empty + "/broken.jpg") << "no";
  Config nothing = folder_config(empty, 2);
  EXPECT_NE(error_of(nothing).find("none of its 1 image files can be decoded"), std::string::npos) << error_of(nothing);
  fs::remove(empty + "/broken.jpg");
  EXPECT_NE(error_of(nothing).find("holds no image files"), std::string::npos) << error_of(nothing);
}

// A small folder trains with the defaults: a tenth of its images is held out, and the first
// line says so and names the file that cannot be decoded, with its reason.
TEST(FolderTrainer, SmallFoldersTrainWithTheDefaultsAndSayWhatWasChosen) {
  test_util::TempDir tmp;
  const std::string root = make_folder(tmp);
  Config c = folder_config(root, 2);
  c.set("data.eval_images", int64_t{0});
  std::vector<std::string> said;
  auto trainer = Trainer::create(c, tmp.file("run"), one(), [&](const std::string& t) { said.push_back(t); });
  std::string all;
  for (const auto& line : said) all += line + "\n";
  EXPECT_NE(all.find("34 training images, 3 held out for evaluation (data.eval_images = 0: a tenth of the 37 "
                     "readable images, at most 64), 1 unreadable (notes.png: "),
            std::string::npos)
      << all;
  EXPECT_EQ(trainer->run({}).test.images, 3);
}

// A global batch left at its default that a small folder cannot fill is fitted, and the fitted batch is the
// run's one batch size: its settings say it as its recorded configuration does.
TEST(FolderTrainer, AFittedBatchIsTheSettingsAndTheRecordsBatch) {
  test_util::TempDir tmp;
  const Config given = folder_config(make_folder(tmp), 1);
  Config c{lockstep_schema()};
  for (const KeySpec& k : lockstep_schema().keys()) {
    if (k.key != "train.batch_size" && !given.is_default(k.key)) c.set(k.key, given.get(k.key));
  }
  auto trainer = Trainer::create(c, tmp.file("run"), one());
  const int64_t batch = trainer->settings().train.batch_size();
  EXPECT_LT(batch, 64);
  EXPECT_EQ(std::get<int64_t>(trainer->config().get("train.batch_size")), batch);
}

}  // namespace
}  // namespace lockstep::train
#endif  // LOCKSTEP_HAVE_OPENCV
