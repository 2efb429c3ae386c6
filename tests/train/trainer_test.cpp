// End-to-end training on a slice of Fashion-MNIST: the loss falls, and a resumed run is bit for bit
// the uninterrupted one.
#include "lockstep/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/lr_schedule.h"
#include "lockstep/train/metrics.h"
#include "lockstep/train/model_factory.h"
#include "lockstep/train/run_dir.h"
#include "model/random_lpips.h"
#include "train/small_run.h"

namespace lockstep::train {
namespace {

Config small_config(int64_t steps) {
  test_util::SmallRun r;
  r.steps = steps;
  r.log_every = 5;
  return test_util::small_run(r);
}

std::shared_ptr<dist::Group> one() { return dist::make_single_process_group(); }

TEST(Trainer, LossFallsAndTheRunDirectoryIsComplete) {
  test_util::TempDir tmp;
  const std::string run = tmp.file("run");
  const TrainSummary s = Trainer::create(small_config(60), run, one())->run({});
  EXPECT_EQ(s.steps, 60);
  EXPECT_FALSE(s.interrupted);

  std::vector<double> losses;
  bool saw_eval = false;
  for (const auto& r : read_metrics(metrics_path(run))) {
    for (const auto& [k, v] : r.values) {
      if (r.kind == "train" && k == "loss") losses.push_back(v);
    }
    saw_eval |= r.kind == "eval" && r.step == 60;
  }
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
  EXPECT_TRUE(saw_eval);
  EXPECT_GT(s.test.psnr_db, 10.0);
  EXPECT_GT(s.test.codes_used, 1);
  // 4 originals above their reconstructions, each 28x28 image scaled 4x so a person can see it.
  EXPECT_EQ(s.test.grid.width, 4 * 112 + 3 * 2);
  EXPECT_EQ(s.test.grid.height, 2 * 112 + 2);
  for (const auto& path : {config_path(run), checkpoint_path(run), reconstructions_path(run), summary_path(run)}) {
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
  }
  // The checkpoint is self-describing: its embedded config is the run's.
  const Checkpoint c = load_checkpoint(checkpoint_path(run));
  EXPECT_EQ(c.step, 60);
  EXPECT_EQ(c.config_toml, io::read_file(config_path(run)));
  // data.dataset = "auto" is recorded as what it found.
  EXPECT_NE(c.config_toml.find("dataset = \"fashion-mnist\""), std::string::npos);
}

// The vqgan architecture (GroupNorm, attention at 14x14 and in the middle) trains through the same
// trainer: the loss falls, and the run's checkpoint rebuilds the model it trained.
TEST(Trainer, TheVqganModelTrainsAndItsLossFalls) {
  test_util::TempDir tmp;
  const std::string run = tmp.file("run");
  Config c = small_config(30);
  for (const char* setting : {"model.architecture=vqgan", "model.norm_groups=4", "model.attention_levels=1"}) {
    c.set_from_string(setting);
  }
  const TrainSummary s = Trainer::create(c, run, one())->run({});
  EXPECT_EQ(s.steps, 30);
  std::vector<double> losses;
  for (const auto& r : read_metrics(metrics_path(run))) {
    for (const auto& [k, v] : r.values) {
      if (r.kind == "train" && k == "loss") losses.push_back(v);
    }
  }
  ASSERT_EQ(losses.size(), 6u);
  for (double loss : losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
  EXPECT_GT(s.test.psnr_db, 10.0);
  const TrainedModel trained = load_trained_model(run);
  EXPECT_EQ(trained.model->options().architecture(), model::Architecture::Vqgan);
  EXPECT_EQ(trained.model->options().attention_levels(), std::vector<int64_t>{1});
}

void expect_same_checkpoints(const std::string& a, const std::string& b) {
  const Checkpoint ca = load_checkpoint(a), cb = load_checkpoint(b);
  EXPECT_EQ(ca.step, cb.step);
  EXPECT_EQ(ca.optimizer_steps, cb.optimizer_steps);
  ASSERT_EQ(ca.model.size(), cb.model.size());
  for (const auto& [name, t] : ca.model) {
    EXPECT_TRUE(torch::equal(t, cb.model.at(name))) << "model tensor " << name << " differs";
  }
  ASSERT_EQ(ca.optimizer.size(), cb.optimizer.size());
  for (const auto& [name, t] : ca.optimizer) {
    EXPECT_TRUE(torch::equal(t, cb.optimizer.at(name))) << "optimizer tensor " << name << " differs";
  }
  ASSERT_EQ(ca.ema.size(), cb.ema.size());
  for (const auto& [name, t] : ca.ema) {
    EXPECT_TRUE(torch::equal(t, cb.ema.at(name))) << "weight-average tensor " << name << " differs";
  }
  EXPECT_EQ(ca.disc_optimizer_steps, cb.disc_optimizer_steps);
  ASSERT_EQ(ca.discriminator.size(), cb.discriminator.size());
  for (const auto& [name, t] : ca.discriminator) {
    EXPECT_TRUE(torch::equal(t, cb.discriminator.at(name))) << "discriminator tensor " << name << " differs";
  }
  ASSERT_EQ(ca.disc_optimizer.size(), cb.disc_optimizer.size());
  for (const auto& [name, t] : ca.disc_optimizer) {
    EXPECT_TRUE(torch::equal(t, cb.disc_optimizer.at(name))) << "discriminator optimizer tensor " << name << " differs";
  }
}

// Each quantizer with the options that use randomness and statistics during training (and the
// schedule and clipping, which depend on the step and on the gradients).
struct QuantizerSetup {
  std::string name;
  std::vector<std::string> settings;
  std::string label;  // the test's name when the quantizer's alone is taken
};

class TrainerResume : public ::testing::TestWithParam<QuantizerSetup> {};

TEST_P(TrainerResume, InterruptedAndResumedRunIsBitwiseTheUninterruptedOne) {
  test_util::TempDir tmp;
  auto config = [&] {
    Config c = small_config(25);
    c.set("quantizer.name", GetParam().name);
    for (const auto& assignment : GetParam().settings) c.set_from_string(assignment);
    return c;
  };
  // 640 / 32 = 20 steps per epoch: the runs cross an epoch boundary after the interruption.
  Trainer::create(config(), tmp.file("straight"), one())->run({});

  std::atomic<bool> stop{false};
  TrainCallbacks cb;
  cb.stop_requested = &stop;
  cb.on_step = [&](const StepReport& r) { stop = r.step == 13; };
  const TrainSummary first = Trainer::create(config(), tmp.file("resumed"), one())->run(cb);
  EXPECT_TRUE(first.interrupted);
  // The step during which the stop was seen completes, on one rank as on many (the request travels
  // with that step's gradients, so every rank stops after the same step).
  EXPECT_EQ(first.steps, 14);

  const TrainSummary rest = Trainer::resume(tmp.file("resumed"), {}, one())->run({});
  EXPECT_EQ(rest.steps, 25);
  expect_same_checkpoints(checkpoint_path(tmp.file("straight")), checkpoint_path(tmp.file("resumed")));
  // The resumed run's metrics hold each step once.
  std::vector<int64_t> steps;
  for (const auto& r : read_metrics(metrics_path(tmp.file("resumed")))) {
    if (r.kind == "train") steps.push_back(r.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{5, 10, 15, 20, 25}));
}

INSTANTIATE_TEST_SUITE_P(
    Quantizers, TrainerResume,
    ::testing::Values(
        QuantizerSetup{"fsq", {}},
        QuantizerSetup{"vq",
                       {"quantizer.vq.codebook_size=64", "quantizer.vq.kmeans_init=true", "quantizer.vq.kmeans_iters=2",
                        "quantizer.vq.threshold_ema_dead_code=1"}},
        QuantizerSetup{"lfq", {"quantizer.lfq.codebook_size=64"}},
        QuantizerSetup{
            "fsq", {"train.warmup_steps=4", "train.lr_decay=cosine", "train.grad_clip=0.05"}, "fsq_cosine_clipped"},
        QuantizerSetup{"vq", {"quantizer.vq.codebook_size=64", "train.ema_decay=0.9"}, "vq_weight_average"},
        QuantizerSetup{"lfq", {"quantizer.lfq.codebook_size=64", "train.grad_accum=4"}, "lfq_accumulated"},
        QuantizerSetup{"fsq", {"train.precision=bfloat16"}, "fsq_bfloat16"},
        // The discriminator starts mid-run (before the interruption) with LeCam's averages.
        QuantizerSetup{"fsq",
                       {"loss.l1=1", "loss.adversarial=0.5", "loss.gan_start_step=8", "loss.lecam=0.1",
                        "loss.disc_channels=8", "loss.disc_layers=2"},
                       "fsq_adversarial"},
        QuantizerSetup{"fsq",
                       {"loss.adversarial=0.5", "loss.gan_start_step=8", "loss.disc_channels=8", "loss.disc_layers=2",
                        "train.grad_accum=2"},
                       "fsq_adversarial_accumulated"},
        QuantizerSetup{"vq",
                       {"quantizer.vq.codebook_size=64", "model.architecture=vqgan", "model.norm_groups=4",
                        "model.attention_levels=1"},
                       "vq_vqgan"}),
    [](const ::testing::TestParamInfo<QuantizerSetup>& info) {
      return info.param.label.empty() ? info.param.name : info.param.label;
    });

// The metrics carry each logged step's learning rate (warm-up, then cosine) and gradient norm; a
// limit below the norms clips every step, which changes the run.
TEST(Trainer, TheScheduleAndTheClippingShowInTheMetricsAndTheRun) {
  test_util::TempDir tmp;
  Config c = small_config(20);
  c.set_from_string("train.warmup_steps=5");
  c.set_from_string("train.lr_decay=cosine");
  c.set_from_string("train.lr_final_ratio=0.25");
  Trainer::create(c, tmp.file("free"), one())->run({});
  const LrSchedule schedule(
      LrScheduleOptions().lr(c.get_float("train.lr")).warmup_steps(5).decay("cosine").final_ratio(0.25), 20);
  auto value = [](const MetricsRecord& r, const std::string& name) -> double {
    for (const auto& [key, v] : r.values) {
      if (key == name) return v;
    }
    ADD_FAILURE() << "no " << name << " at step " << r.step;
    return NAN;
  };
  double smallest_norm = INFINITY;
  int logged = 0;
  for (const auto& r : read_metrics(metrics_path(tmp.file("free")))) {
    if (r.kind != "train") continue;
    ++logged;
    EXPECT_DOUBLE_EQ(value(r, "lr"), schedule.at(r.step)) << "step " << r.step;
    EXPECT_TRUE(std::isfinite(value(r, "grad_norm")) && value(r, "grad_norm") > 0);
    smallest_norm = std::min(smallest_norm, value(r, "grad_norm"));
  }
  EXPECT_EQ(logged, 4);
  c.set("train.grad_clip", smallest_norm / 10);
  Trainer::create(c, tmp.file("clipped"), one())->run({});
  const Checkpoint free = load_checkpoint(checkpoint_path(tmp.file("free")));
  const Checkpoint clipped = load_checkpoint(checkpoint_path(tmp.file("clipped")));
  bool differs = false;
  for (const auto& [name, t] : free.model) differs = differs || !torch::equal(t, clipped.model.at(name));
  EXPECT_TRUE(differs) << "clipping every step to a tenth of the smallest norm changed nothing";
}

// A weight average is kept, saved, evaluated and loadable, and does not change the training itself.
TEST(Trainer, TheWeightAverageIsSavedAndEvaluatedBesideTheWeights) {
  test_util::TempDir tmp;
  Config c = small_config(12);
  const TrainSummary plain = Trainer::create(c, tmp.file("plain"), one())->run({});
  c.set_from_string("train.ema_decay=0.8");
  const TrainSummary averaged = Trainer::create(c, tmp.file("averaged"), one())->run({});
  const Checkpoint a = load_checkpoint(checkpoint_path(tmp.file("plain")));
  const Checkpoint b = load_checkpoint(checkpoint_path(tmp.file("averaged")));
  EXPECT_TRUE(a.ema.empty());
  ASSERT_EQ(b.ema.size(), b.model.size());
  bool averaged_differs = false;
  for (const auto& [name, t] : b.model) {
    EXPECT_TRUE(torch::equal(t, a.model.at(name))) << "keeping an average changed the training: " << name;
    averaged_differs = averaged_differs || !torch::equal(t, b.ema.at(name));
  }
  EXPECT_TRUE(averaged_differs);
  EXPECT_EQ(plain.test_weight_average.images, 0);
  EXPECT_EQ(averaged.test_weight_average.images, averaged.test.images);
  EXPECT_TRUE(averaged.test_weight_average.weight_average && !averaged.test.weight_average);
  EXPECT_NE(averaged.test_weight_average.mse, averaged.test.mse);
  const std::string summary = io::read_file(summary_path(tmp.file("averaged")));
  EXPECT_NE(summary.find("\"test_ema\""), std::string::npos) << summary;
  bool logged = false;
  for (const auto& r : read_metrics(metrics_path(tmp.file("averaged")))) logged = logged || r.kind == "eval_ema";
  EXPECT_TRUE(logged);
  // Loading the average gives the model the evaluation just reported.
  const TrainedModel loaded = load_trained_model(tmp.file("averaged"), /*weight_average=*/true);
  for (const auto& [name, t] : module_state(*loaded.model)) EXPECT_TRUE(torch::equal(t, b.ema.at(name))) << name;
  EXPECT_THROW(load_trained_model(tmp.file("plain"), /*weight_average=*/true), InvalidArgument);
}

TEST(Trainer, CrashAfterACheckpointResumesFromItExactly) {
  test_util::TempDir tmp;
  Trainer::create(small_config(24), tmp.file("straight"), one())->run({});

  Config c = small_config(24);
  c.set("train.checkpoint_every", int64_t{8});
  TrainCallbacks crash;
  crash.on_step = [](const StepReport& r) {
    if (r.step == 19) throw std::runtime_error("simulated crash");
  };
  EXPECT_THROW(Trainer::create(c, tmp.file("crashed"), one())->run(crash), std::runtime_error);
  EXPECT_EQ(load_checkpoint(checkpoint_path(tmp.file("crashed"))).step, 16);

  auto resumed = Trainer::resume(tmp.file("crashed"), {}, one());
  EXPECT_EQ(resumed->step(), 16);
  resumed->run({});
  expect_same_checkpoints(checkpoint_path(tmp.file("straight")), checkpoint_path(tmp.file("crashed")));
}

TEST(Trainer, ResumeMayExtendTrainingButNotChangeTheModel) {
  test_util::TempDir tmp;
  Trainer::create(small_config(5), tmp.file("run"), one())->run({});
  try {
    Trainer::resume(tmp.file("run"), {"model.channels=[4,8]"}, one());
    FAIL() << "changing the model on resume was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model.channels"), std::string::npos) << e.what();
  }
  const TrainSummary s = Trainer::resume(tmp.file("run"), {"train.steps=8"}, one())->run({});
  EXPECT_EQ(s.steps, 8);
}

// train.device is the rank's own business: a resumed run may move to another device (the checkpoint
// holds host copies); a device that is not there fails before any data is read.
TEST(Trainer, ResumeMayChangeTheDeviceAndAMissingDeviceFailsAtOnce) {
  test_util::TempDir tmp;
  Trainer::create(small_config(3), tmp.file("run"), one())->run({});
  const TrainSummary s = Trainer::resume(tmp.file("run"), {"train.device=cpu", "train.steps=5"}, one())->run({});
  EXPECT_EQ(s.steps, 5);
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  Config cuda = small_config(2);
  cuda.set("train.device", std::string("cuda"));
  try {
    Trainer::create(cuda, tmp.file("cuda"), one());
    FAIL() << "trained on a CUDA device that does not exist";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("train.device = cuda, but"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(metrics_path(tmp.file("cuda"))));
}

TEST(Trainer, RefusesARunDirectoryThatHoldsARun) {
  test_util::TempDir tmp;
  Trainer::create(small_config(2), tmp.file("run"), one())->run({});
  try {
    Trainer::create(small_config(2), tmp.file("run"), one());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
}

// Without a group, resume is refused by name; it once asked the missing group for its rank first.
TEST(Trainer, ResumeWithoutAGroupIsRefused) {
  test_util::TempDir tmp;
  try {
    Trainer::resume(tmp.path(), {}, nullptr);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no process group"), std::string::npos) << e.what();
  }
}

TEST(Trainer, ImpossibleSettingsFailBeforeTraining) {
  test_util::TempDir tmp;
  Config big_batch = small_config(2);
  big_batch.set("train.batch_size", int64_t{1000});
  EXPECT_THROW(Trainer::create(big_batch, tmp.file("a"), one()), InvalidArgument);
  Config deep = small_config(2);
  deep.set("model.channels", std::vector<int64_t>{4, 4, 4, 4});  // 28 is not a multiple of 8
  EXPECT_THROW(Trainer::create(deep, tmp.file("b"), one()), InvalidArgument);
  Config no_data = small_config(2);
  no_data.set("data.dir", tmp.file("nowhere"));
  try {
    Trainer::create(no_data, tmp.file("c"), one());
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("dataset-fashion-mnist"), std::string::npos) << e.what();
  }
}

// A second process training into the same directory (or resuming it) while a run holds it is
// refused, instead of the two runs overwriting each other's files.
TEST(Trainer, ARunDirectoryInUseIsRefused) {
  test_util::TempDir tmp;
  const std::string run = tmp.file("run");
  auto first = Trainer::create(small_config(2), run, one());
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0)
        Trainer::create(small_config(2), run, one());
      else
        Trainer::resume(run, {}, one());
      FAIL() << "a second trainer took the run directory";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("is in use by another lockstep process (pid " + std::to_string(::getpid())),
                std::string::npos)
          << e.what();
    }
  }
  first->run({});
  first.reset();  // the lock ends with its holder
  EXPECT_EQ(Trainer::resume(run, {"train.steps=3"}, one())->run({}).steps, 3);
}

// Temporary files of a process killed while writing are removed when the run is resumed.
TEST(Trainer, ResumeRemovesTemporaryFilesAKilledProcessLeft) {
  test_util::TempDir tmp;
  const std::string run = tmp.file("run");
  Trainer::create(small_config(2), run, one())->run({});
  const std::string stale = checkpoint_path(run) + ".tmp.123456.0";
  io::write_file_atomic(stale, "half a checkpoint");
  io::write_file_atomic(run + "/notes.tmp.txt", "not ours");
  std::vector<std::string> said;
  Trainer::resume(run, {"train.steps=3"}, one(), [&](const std::string& text) { said.push_back(text); });
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(run + "/notes.tmp.txt"));
  ASSERT_FALSE(said.empty());
  EXPECT_NE(said[0].find("removed 1 temporary file(s)"), std::string::npos) << said[0];
}

// VQ at lr 10 overflows at step 3 (loss 2.4e20 at step 2, nan at 3): the run stops there with an
// error naming the step, and the checkpoint of step 2 stays as it was.
TEST(Trainer, ADivergingRunStopsAtTheFirstNonFiniteLossAndKeepsItsLastCheckpoint) {
  test_util::TempDir tmp;
  const std::string run = tmp.file("run");
  Config c = small_config(20);
  c.set("quantizer.name", std::string("vq"));
  c.set("train.lr", 10.0);
  c.set("train.checkpoint_every", int64_t{1});
  c.set("train.log_every", int64_t{1});
  auto trainer = Trainer::create(c, run, one());
  try {
    trainer->run({});
    FAIL() << "a run whose loss became nan finished";
  } catch (const TrainingDiverged& e) {
    EXPECT_NE(std::string(e.what()).find("step 3: the loss is"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("still holds step 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(load_checkpoint(checkpoint_path(run)).step, 2);
  for (const auto& r : read_metrics(metrics_path(run))) {
    for (const auto& [k, v] : r.values) EXPECT_TRUE(std::isfinite(v)) << r.kind << " " << k << " at step " << r.step;
  }
}

}  // namespace
}  // namespace lockstep::train

namespace lockstep::train {
namespace {

double value_of(const MetricsRecord& r, const std::string& name) {
  for (const auto& [key, v] : r.values) {
    if (key == name) return v;
  }
  return NAN;
}

// The perceptual loss trains the model (the run differs from one without), and every evaluation
// reports LPIPS: console figures, metrics.jsonl and summary.json.
TEST(Trainer, APerceptualLossTrainsAndLpipsIsEvaluated) {
  test_util::TempDir tmp;
  test_util::write_random_lpips_weights(tmp.file("lpips.safetensors"), 7);
  auto config = [&](bool perceptual) {
    Config c = small_config(3);
    c.set_from_string("data.train_subset=48");
    c.set_from_string("data.test_subset=16");
    c.set_from_string("train.batch_size=16");
    c.set("loss.lpips_weights", tmp.file("lpips.safetensors"));
    if (perceptual) c.set_from_string("loss.perceptual=1");
    return c;
  };
  const TrainSummary with = Trainer::create(config(true), tmp.file("with"), one())->run({});
  const TrainSummary without = Trainer::create(config(false), tmp.file("without"), one())->run({});
  ASSERT_TRUE(with.test.lpips.has_value());
  EXPECT_GT(*with.test.lpips, 0);
  ASSERT_TRUE(without.test.lpips.has_value());  // the weights alone give the figure
  EXPECT_NE(*with.test.lpips, *without.test.lpips);
  const Checkpoint a = load_checkpoint(checkpoint_path(tmp.file("with")));
  const Checkpoint b = load_checkpoint(checkpoint_path(tmp.file("without")));
  EXPECT_FALSE(torch::equal(a.model.at("encoder.0.weight"), b.model.at("encoder.0.weight")));
  bool logged = false;
  for (const auto& r : read_metrics(metrics_path(tmp.file("with")))) {
    if (r.kind == "eval") logged = std::abs(value_of(r, "lpips") - *with.test.lpips) < 1e-9;
  }
  EXPECT_TRUE(logged);
  EXPECT_NE(io::read_file(summary_path(tmp.file("with"))).find("\"lpips\""), std::string::npos);

  Config no_weights = small_config(1);
  no_weights.set_from_string("loss.perceptual=0.5");
  try {
    Trainer::create(no_weights, tmp.file("refused"), one());
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("loss.perceptual = 0.5 needs loss.lpips_weights"), std::string::npos)
        << e.what();
  }
}

// Before loss.gan_start_step the discriminator rests; from it on, its loss and the adversarial
// factor are logged, and the adaptive factor follows the gradients (not the fixed weight).
TEST(Trainer, TheAdversaryStartsAtItsStepAndIsLogged) {
  test_util::TempDir tmp;
  Config c = small_config(10);
  for (const char* s :
       {"loss.adversarial=0.5", "loss.gan_start_step=6", "loss.disc_channels=8", "loss.disc_layers=2"}) {
    c.set_from_string(s);
  }
  Trainer::create(c, tmp.file("run"), one())->run({});
  int logged = 0;
  for (const auto& r : read_metrics(metrics_path(tmp.file("run")))) {
    if (r.kind != "train") continue;
    ++logged;
    if (r.step < 6) {
      EXPECT_EQ(value_of(r, "disc_loss"), 0) << r.step;
      EXPECT_EQ(value_of(r, "adversarial_factor"), 0) << r.step;
    } else {
      EXPECT_GT(value_of(r, "disc_loss"), 0) << r.step;
      EXPECT_GT(value_of(r, "adversarial_factor"), 0) << r.step;
      EXPECT_NE(value_of(r, "adversarial_factor"), 0.5) << r.step;
    }
  }
  EXPECT_EQ(logged, 2);
  EXPECT_EQ(load_checkpoint(checkpoint_path(tmp.file("run"))).disc_optimizer_steps, 5);

  Config nothing = small_config(1);
  for (const char* s : {"loss.adversarial=0.5", "loss.l2=0"}) nothing.set_from_string(s);
  try {
    Trainer::create(nothing, tmp.file("refused"), one());
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("loss.l2, loss.l1 and loss.perceptual are all 0"), std::string::npos)
        << e.what();
  }
}

// With a model and quantizer free of batch statistics (FSQ, no BatchNorm), accumulating four
// micro-batches is the same gradient as the whole batch: the same run up to float rounding.
TEST(Trainer, AccumulatedMicroBatchesTrainAsTheWholeBatch) {
  test_util::TempDir tmp;
  Config whole = small_config(8);
  Config accumulated = small_config(8);
  accumulated.set_from_string("train.grad_accum=4");
  Trainer::create(whole, tmp.file("whole"), one())->run({});
  Trainer::create(accumulated, tmp.file("accumulated"), one())->run({});
  const Checkpoint a = load_checkpoint(checkpoint_path(tmp.file("whole")));
  const Checkpoint b = load_checkpoint(checkpoint_path(tmp.file("accumulated")));
  bool all_equal = true;
  for (const auto& [name, t] : a.model) {
    EXPECT_TRUE(torch::allclose(t, b.model.at(name), 1e-4, 1e-5)) << name;
    all_equal &= torch::equal(t, b.model.at(name));
  }
  EXPECT_FALSE(all_equal) << "summed in another order, some weight should differ in its last bits";

  Config refused = small_config(1);
  refused.set_from_string("train.grad_accum=3");  // 32 images do not cut into 3
  try {
    Trainer::create(refused, tmp.file("refused"), one());
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("train.grad_accum = 3 must divide train.batch_size = 32"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep::train
