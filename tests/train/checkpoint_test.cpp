#include "lockstep/train/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "io/test_temp_dir.h"
#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"
#include "lockstep/io/safetensors.h"
#include "lockstep/model/autoencoder.h"
#include "lockstep/quant/fsq.h"
#include "lockstep/train/adam.h"

namespace lockstep::train {
namespace {

model::Autoencoder small_model(std::vector<int64_t> channels) {
  return model::Autoencoder(model::AutoencoderOptions(1, std::move(channels)),
                            std::make_shared<quant::Fsq>(quant::FsqOptions({5, 5})));
}

Checkpoint sample_checkpoint(model::Autoencoder& m) {
  Checkpoint c;
  c.model = module_state(*m);
  c.optimizer = {{"exp_avg.x", torch::randn({3})}};
  c.torch_rng = at::detail::getDefaultCPUGenerator().get_state();
  c.step = 42;
  c.optimizer_steps = 41;
  c.config_toml = "[train]\nlr = 0.5\n";
  return c;
}

TEST(Checkpoint, RoundTripsEveryPart) {
  test_util::TempDir tmp;
  auto m = small_model({4, 8});
  const Checkpoint c = sample_checkpoint(m);
  save_checkpoint(tmp.file("c.safetensors"), c);
  const Checkpoint r = load_checkpoint(tmp.file("c.safetensors"));
  EXPECT_EQ(r.step, 42);
  EXPECT_EQ(r.optimizer_steps, 41);
  EXPECT_EQ(r.config_toml, c.config_toml);
  EXPECT_TRUE(torch::equal(r.torch_rng, c.torch_rng));
  ASSERT_EQ(r.model.size(), c.model.size());
  for (const auto& [name, t] : c.model) EXPECT_TRUE(torch::equal(r.model.at(name), t)) << name;
  EXPECT_TRUE(torch::equal(r.optimizer.at("exp_avg.x"), c.optimizer.at("exp_avg.x")));

  auto other = small_model({4, 8});
  load_module_state(*other, r.model, "test");
  for (const auto& [name, t] : module_state(*other)) EXPECT_TRUE(torch::equal(t, c.model.at(name))) << name;
}

TEST(Checkpoint, AModelOfAnotherShapeIsRefusedByName) {
  test_util::TempDir tmp;
  auto m = small_model({4, 8});
  save_checkpoint(tmp.file("c.safetensors"), sample_checkpoint(m));
  auto wider = small_model({6, 8});
  try {
    load_module_state(*wider, load_checkpoint(tmp.file("c.safetensors")).model, tmp.file("c.safetensors"));
    FAIL() << "a checkpoint of another shape was loaded";
  } catch (const CorruptInput& e) {
    const std::string what = e.what();
    // Names a tensor whose shape changed, both shapes, and the file.
    EXPECT_NE(what.find("' is Float [4], the model needs Float [6]"), std::string::npos) << what;
    EXPECT_NE(what.find("c.safetensors"), std::string::npos) << what;
  }
}

// A nan weight made encode write token ids of -2^31 and exit 0: such a checkpoint is refused.
TEST(Checkpoint, NonFiniteWeightsAreRefusedByName) {
  test_util::TempDir tmp;
  auto m = small_model({4, 8});
  Checkpoint c = sample_checkpoint(m);
  auto& [name, tensor] = *c.model.begin();
  tensor = tensor.clone();
  tensor.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  save_checkpoint(tmp.file("nan.safetensors"), c);
  auto fresh = small_model({4, 8});
  try {
    load_module_state(*fresh, load_checkpoint(tmp.file("nan.safetensors")).model, tmp.file("nan.safetensors"));
    FAIL() << "a checkpoint with a nan weight was loaded";
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("tensor '" + name + "' holds nan or infinite values"), std::string::npos)
        << e.what();
  }
}

// Numbers in the metadata are digits only, as lockstep writes them (" 10" and "+10" loaded before).
TEST(Checkpoint, MetadataNumbersAreDigitsOnly) {
  test_util::TempDir tmp;
  auto m = small_model({4, 8});
  save_checkpoint(tmp.file("c.safetensors"), sample_checkpoint(m));
  // Digits, but more than lockstep writes (INT64_MAX is 19 digits): the limit is named.
  const std::string not_digits = "is not a non-negative integer",
                    too_long = "is too large: lockstep writes at most 18 digits";
  for (const auto& [bad, expected] :
       std::vector<std::pair<std::string, std::string>>{{" 10", not_digits},
                                                        {"+10", not_digits},
                                                        {"10 ", not_digits},
                                                        {"1e3", not_digits},
                                                        {"", not_digits},
                                                        {"9223372036854775807", too_long},
                                                        {"99999999999999999999", too_long}}) {
    io::SafetensorsData data = io::load_safetensors(tmp.file("c.safetensors"));
    data.metadata["step"] = bad;
    io::save_safetensors(tmp.file("bad.safetensors"), data);
    try {
      load_checkpoint(tmp.file("bad.safetensors"));
      FAIL() << "step '" << bad << "' was accepted";
    } catch (const CorruptInput& e) {
      EXPECT_NE(std::string(e.what()).find("'step' = '" + bad + "' " + expected), std::string::npos) << e.what();
    }
  }
}

TEST(Checkpoint, DamagedOrForeignFilesAreNamedErrors) {
  test_util::TempDir tmp;
  auto m = small_model({4, 8});
  save_checkpoint(tmp.file("c.safetensors"), sample_checkpoint(m));
  const std::string bytes = io::read_file(tmp.file("c.safetensors"));
  io::write_file_atomic(tmp.file("truncated.safetensors"), bytes.substr(0, bytes.size() / 2));
  EXPECT_THROW(load_checkpoint(tmp.file("truncated.safetensors")), CorruptInput);

  io::SafetensorsData foreign;
  foreign.tensors["weight"] = io::RawTensor{io::DType::F32, {1}, std::string(4, '\0')};
  io::save_safetensors(tmp.file("foreign.safetensors"), foreign);
  try {
    load_checkpoint(tmp.file("foreign.safetensors"));
    FAIL();
  } catch (const CorruptInput& e) {
    EXPECT_NE(std::string(e.what()).find("not a lockstep checkpoint"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_checkpoint(tmp.file("missing.safetensors")), IoError);
}

TEST(Adam, StateRoundTripsAndContinuesIdentically) {
  torch::manual_seed(0);
  at::Tensor w1 = torch::randn({4, 3}, torch::requires_grad());
  at::Tensor w2 = w1.detach().clone().requires_grad_();
  const at::Tensor initial = w1.detach().clone();
  Adam a({{"w", w1}}, AdamOptions().lr(0.1));
  Adam b({{"w", w2}}, AdamOptions().lr(0.1));
  const at::Tensor target = torch::randn({4, 3});
  auto step = [&](Adam& opt, at::Tensor& w) {
    opt.zero_grad();
    (w - target).pow(2).sum().backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step(a, w1);
  // b takes a's state and parameters, then both continue in lockstep.
  {
    torch::NoGradGuard g;
    w2.copy_(w1);
  }
  b.load_state(a.state(), a.steps());
  for (int i = 0; i < 4; ++i) {
    step(a, w1);
    step(b, w2);
  }
  EXPECT_TRUE(torch::equal(w1, w2));
  EXPECT_LT((w1 - target).pow(2).sum().item<float>(), 0.5f * (initial - target).pow(2).sum().item<float>());
  EXPECT_THROW(b.load_state({}, 1), CorruptInput);
}

// Damage that loaded silently before: a step count that overflows the next step, moments of
// another dtype (cast on load), and tensors the optimizer does not have.
TEST(Adam, DamagedStateIsRefusedNotCast) {
  at::Tensor w = torch::zeros({4, 3}, torch::requires_grad());
  Adam a({{"w", w}}, AdamOptions());
  const auto good = a.state();
  a.load_state(good, 7);
  auto message = [&](const std::map<std::string, at::Tensor>& state, int64_t steps) {
    try {
      a.load_state(state, steps);
    } catch (const CorruptInput& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message(good, INT64_MAX).find("step count 9223372036854775807 is outside"), std::string::npos);
  auto ints = good;
  ints["exp_avg.w"] = ints["exp_avg.w"].to(torch::kInt32);
  EXPECT_NE(message(ints, 1).find("'exp_avg.w' is Int, the model needs Float"), std::string::npos) << message(ints, 1);
  auto extra = good;
  extra["exp_avg.other"] = torch::zeros({1});
  EXPECT_NE(message(extra, 1).find("optimizer state has 3 tensors, but this model's optimizer has 2"),
            std::string::npos);
  // Moments Adam never writes: an infinite second moment resumed silently and stalled the weights.
  auto infinite = good;
  infinite["exp_avg_sq.w"] = torch::full({4, 3}, INFINITY);
  EXPECT_NE(message(infinite, 1).find("'exp_avg_sq.w' holds values that are not finite"), std::string::npos)
      << message(infinite, 1);
  auto nan_mean = good;
  nan_mean["exp_avg.w"] = torch::full({4, 3}, NAN);
  EXPECT_NE(message(nan_mean, 1).find("'exp_avg.w' holds values that are not finite"), std::string::npos);
  auto negative = good;
  negative["exp_avg_sq.w"] = -torch::ones({4, 3});
  EXPECT_NE(message(negative, 1).find("'exp_avg_sq.w' holds negative second moments (smallest -1)"), std::string::npos)
      << message(negative, 1);
}

// A step count of 2^53 or more (not exact as a double) is refused when the file is read, naming the file.
TEST(Checkpoint, StepCountsBeyondExactDoublesAreRefusedOnLoad) {
  test_util::TempDir tmp;
  auto m = small_model({4, 8});
  save_checkpoint(tmp.file("c.safetensors"), sample_checkpoint(m));
  for (const std::string key : {"step", "optimizer_steps"}) {
    io::SafetensorsData data = io::load_safetensors(tmp.file("c.safetensors"));
    data.metadata[key] = std::to_string((int64_t{1} << 53) + 1);
    io::save_safetensors(tmp.file("big.safetensors"), data);
    try {
      load_checkpoint(tmp.file("big.safetensors"));
      ADD_FAILURE() << key << " = 2^53 + 1 was accepted";
    } catch (const CorruptInput& e) {
      EXPECT_NE(std::string(e.what()).find("'" + key + "' = 9007199254740993 is not below 2^53"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::train
