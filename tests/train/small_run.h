// The small training configuration the trainer tests share: a tiny model on one thread, no
// checkpoints, on part of Fashion-MNIST (or an image folder the test sets); each test sets the keys
// it is about on top. The sizes differ per suite, so they are fields with the common defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/train/config.h"

namespace lockstep::test_util {

struct SmallRun {
  int64_t steps = 4;
  int64_t train_images = 640;  // data.train_subset; 0 leaves it unset (an image folder's test)
  int64_t test_images = 128;   // data.test_subset; 0 leaves it unset
  std::vector<int64_t> channels{8, 16};
  int64_t batch = 32;
  int64_t log_every = 0;       // 0 leaves train.log_every at its default
  int64_t grid_images = 4;     // 0 leaves eval.grid_images at its default
  bool no_checkpoints = true;  // train.checkpoint_every = 0
};

inline train::Config small_run(const SmallRun& r, const std::string& data_dir = LOCKSTEP_FASHION_MNIST_DIR) {
  train::Config c(train::lockstep_schema());
  c.set("data.dir", data_dir);
  if (r.train_images > 0) c.set("data.train_subset", r.train_images);
  if (r.test_images > 0) c.set("data.test_subset", r.test_images);
  c.set("model.channels", r.channels);
  c.set("train.batch_size", r.batch);
  c.set("train.steps", r.steps);
  c.set("train.threads", int64_t{1});
  if (r.log_every > 0) c.set("train.log_every", r.log_every);
  if (r.no_checkpoints) c.set("train.checkpoint_every", int64_t{0});
  if (r.grid_images > 0) c.set("eval.grid_images", r.grid_images);
  return c;
}

}  // namespace lockstep::test_util
