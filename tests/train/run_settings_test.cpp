// The run settings' table: each key bound to its own member, the uses marked on the keys, the
// checks across keys, and resolving a run (new or resumed) the same way for the CLI and trainer.
#include "lockstep/train/run_settings.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "error_of.h"
#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/train/resolve_run.h"
#include "lockstep/train/run_dir.h"

namespace lockstep::train {
namespace {

using test_util::error_of;

// A value `key` accepts other than its default: the first candidate its schema entry takes.
Value another_value(const KeySpec& spec) {
  std::vector<Value> candidates;
  switch (spec.type) {
    case ValueType::Bool:
      candidates = {!std::get<bool>(spec.default_value)};
      break;
    case ValueType::Int: {
      const int64_t d = std::get<int64_t>(spec.default_value);
      for (const auto& choice : spec.choices) candidates.emplace_back(int64_t{std::stoll(choice)});
      candidates.emplace_back(d + 1);
      candidates.emplace_back(d - 1);
      break;
    }
    case ValueType::Float: {
      const double d = std::get<double>(spec.default_value);
      candidates = {d + 0.5, d / 2, d - 0.5};
      break;
    }
    case ValueType::String:
      for (const auto& choice : spec.choices) candidates.emplace_back(choice);
      for (const char* s : {"64x64", "cuda:1", "elsewhere"}) candidates.emplace_back(std::string(s));
      break;
    case ValueType::IntList:
      candidates = {std::vector<int64_t>{2}, std::vector<int64_t>{8, 8}};
      break;
    case ValueType::FloatList:
      candidates = {std::vector<double>{0.5}};
      break;
  }
  for (Value& v : candidates) {
    if (v == spec.default_value) continue;
    Config probe(lockstep_schema());
    try {
      probe.set(spec.key, v);
      return v;
    } catch (const InvalidArgument&) {
    }
  }
  ADD_FAILURE() << "no other value found for " << spec.key;
  return spec.default_value;
}

TEST(RunSettings, EveryKeyIsReadIntoItsOwnMemberAndWrittenBackFromIt) {
  const Config defaults(lockstep_schema());
  for (const RunKey& changed : run_keys()) {
    const Value value = another_value(changed.spec);
    Config config(lockstep_schema());
    config.set(changed.spec.key, value);
    RunSettings settings;
    for (const RunKey& k : run_keys()) k.read(settings, config.get(k.spec.key));
    // Only the changed key's member moved: no two keys share a member, none reads another's.
    for (const RunKey& k : run_keys()) {
      const Value expected = k.spec.key == changed.spec.key ? value : defaults.get(k.spec.key);
      EXPECT_EQ(k.write(settings), expected) << k.spec.key << " after setting " << changed.spec.key;
    }
  }
}

// The uses are a decision per key, so the sets are spelled out here: marking train.lr resumable by
// mistake, or dropping data.dir from the per-rank keys, fails this test.
TEST(RunSettings, TheKeysAResumedRunOrASingleRankMayChangeAreTheseExactly) {
  EXPECT_EQ(resumable_keys(),
            (std::vector<std::string>{"data.dir", "data.workers", "data.prefetch", "train.epochs", "train.steps",
                                      "train.threads", "train.device", "train.grad_bucket_kb", "train.log_every",
                                      "train.checkpoint_every", "train.eval_every", "loss.lpips_weights",
                                      "eval.batch_size", "eval.fid_weights", "eval.grid_images"}));
  EXPECT_EQ(per_rank_keys(), (std::vector<std::string>{"data.dir", "data.workers", "data.prefetch", "train.threads",
                                                       "train.device", "loss.lpips_weights", "eval.fid_weights"}));
  // The quantizer sections are the quantizers' own tables: nothing there may change on resume.
  for (const KeySpec& spec : lockstep_schema().keys()) {
    if (spec.key.rfind("quantizer.", 0) == 0) EXPECT_FALSE(spec.resumable || spec.per_rank) << spec.key;
  }
}

TEST(RunSettings, ChecksAcrossKeysNameTheKeysAndValues) {
  RunSettings s;
  s.train.batch_size(10).grad_accum(4);
  const std::string accum = error_of<InvalidArgument>([&] { check_run_settings(s); });
  EXPECT_NE(accum.find("train.grad_accum = 4 must divide train.batch_size = 10"), std::string::npos) << accum;

  s = RunSettings();
  s.data.dataset("fashion-mnist").random_flip(true);
  EXPECT_NE(error_of<InvalidArgument>([&] { check_run_settings(s); }).find("apply to image folders"),
            std::string::npos);
  s.data.dataset("folder");
  EXPECT_NO_THROW(check_run_settings(s));

  s = RunSettings();
  s.loss.perceptual(0.5);
  EXPECT_NE(error_of<InvalidArgument>([&] { check_run_settings(s); }).find("needs loss.lpips_weights"),
            std::string::npos);

  s = RunSettings();
  s.loss.adversarial(0.1).l2(0);
  EXPECT_NE(error_of<InvalidArgument>([&] { check_run_settings(s); }).find("loss.adaptive_weight"), std::string::npos);
  s.loss.adaptive_weight(false);
  EXPECT_NO_THROW(check_run_settings(s));

  s = RunSettings();
  s.train.batch_size(24).grad_accum(2).shard_size(5);
  const std::string shard = error_of<InvalidArgument>([&] { check_run_settings(s); });
  EXPECT_NE(shard.find("train.shard_size = 5 must divide the micro-batch of 12"), std::string::npos) << shard;
  s.train.shard_size(4);
  EXPECT_NO_THROW(check_run_settings(s));
  s.model.batch_norm(true);
  EXPECT_NE(error_of<InvalidArgument>([&] { check_run_settings(s); }).find("model.batch_norm"), std::string::npos);
  s.model.batch_norm(false);
  s.loss.adversarial(0.1);
  EXPECT_NE(error_of<InvalidArgument>([&] { check_run_settings(s); }).find("does not support loss.adversarial"),
            std::string::npos);
}

TEST(RunSettings, RecordingSetsOnlyTheKeysTheRunChose) {
  Config config(lockstep_schema());
  config.set("train.lr", 1e-3);
  RunSettings s = run_settings(config);
  s.data.dataset("folder");
  s.train.batch_size(16);
  record_run_settings(s, config);
  EXPECT_EQ(config.explicitly_set_keys(), (std::vector<std::string>{"data.dataset", "train.batch_size", "train.lr"}));
  EXPECT_EQ(config.get_string("data.dataset"), "folder");
  EXPECT_EQ(config.get_int("train.batch_size"), 16);
}

TEST(ResolveRun, AResumedRunTakesOverridesOfResumableKeysOnly) {
  const test_util::TempDir dir;
  ResolvedRun first = resolve_new_run("", {"train.batch_size=32", "train.device=cpu"});
  std::ofstream(config_path(dir.path())) << first.config.to_toml();

  const ResolvedRun resumed = resolve_resumed_run(dir.path(), {"train.steps=9", " data.workers = 3"});
  EXPECT_EQ(resumed.settings.train.batch_size(), 32);
  EXPECT_EQ(resumed.settings.train.steps(), 9);
  EXPECT_EQ(resumed.settings.data.workers(), 3);

  for (const char* fixed : {"train.batch_size=16", "quantizer.fsq.levels=[4,4]", "train.nonsense=1"}) {
    const std::string e = error_of<InvalidArgument>([&] { resolve_resumed_run(dir.path(), {fixed}); });
    EXPECT_NE(e.find("when resuming"), std::string::npos) << e;
    EXPECT_NE(e.find("train.device"), std::string::npos) << "lists what may change: " << e;
  }
  EXPECT_THROW(resolve_resumed_run(dir.path() + "/absent", {}), IoError);
}

// A relative data.dir is the directory the run started in's: resumed from elsewhere it names nothing, and the
// refusal says so instead of "Fashion-MNIST is missing".
TEST(ResolveRun, AResumeWhereARelativeDataDirNamesNothingSaysWhy) {
  const test_util::TempDir dir;
  ResolvedRun first = resolve_new_run("", {"data.dir=no-such-data-here"});
  std::ofstream(config_path(dir.path())) << first.config.to_toml();
  const std::string e = error_of<IoError>([&] { resolve_resumed_run(dir.path(), {}); });
  EXPECT_NE(e.find("data.dir 'no-such-data-here' is relative"), std::string::npos) << e;
  EXPECT_NE(e.find("--set data.dir=PATH"), std::string::npos) << e;
  EXPECT_NO_THROW(resolve_resumed_run(dir.path(), {"data.dir=" + dir.path()}));
}

TEST(ResolveRun, ANewRunRefusesABadQuantizerSectionItDoesNotUse) {
  const std::string e = error_of<InvalidArgument>([] { resolve_new_run("", {"quantizer.lfq.codebook_size=1000"}); });
  EXPECT_NE(e.find("[quantizer.lfq] lfq: codebook_size = 1000 must be a power of two"), std::string::npos) << e;
  EXPECT_EQ(cuda_device_index(resolve_new_run("", {}).settings), -1);
  // Checks across keys are the trainer's: --print-config shows such a configuration as it is.
  EXPECT_NO_THROW(resolve_new_run("", {"loss.perceptual=1"}));
  EXPECT_THROW(run_settings(resolve_new_run("", {"loss.perceptual=1"}).config), InvalidArgument);
}

TEST(ResolveRun, AutoDatasetIsWhatTheDirectoryHolds) {
  const test_util::TempDir dir;
  DataSettings data;
  data.dir(dir.path());
  resolve_dataset(data);
  EXPECT_EQ(data.dataset(), "folder");

  data.dataset("auto").dir(dir.path() + "/absent");
  resolve_dataset(data);
  EXPECT_EQ(data.dataset(), "fashion-mnist") << "a missing directory keeps Fashion-MNIST's error";

  data.dataset("fashion-mnist").dir(dir.path());
  resolve_dataset(data);
  EXPECT_EQ(data.dataset(), "fashion-mnist") << "a chosen dataset stays";
}

}  // namespace
}  // namespace lockstep::train
