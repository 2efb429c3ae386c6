// Where a run's training batches and evaluation images come from: Fashion-MNIST or an image
// folder, both through the global plan of data/plan.h, so the trainer sees one interface: the
// batch of global step t for this rank, the epoch's plan, and the images to evaluate on.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/data/buckets.h"
#include "lockstep/data/image_set.h"
#include "lockstep/data/plan.h"
#include "lockstep/train/data_settings.h"

namespace lockstep::train {

struct StepBatch {
  at::Tensor images;     // this rank's part of the step's global batch, (n, c, h, w) in [-1, 1]
  int64_t replaced = 0;  // of those, images that failed to decode and were replaced
  double waited_s = 0;   // time spent waiting for the loader
};

class TrainData {
 public:
  virtual ~TrainData() = default;

  virtual int64_t channels() const = 0;
  virtual int64_t training_images() const = 0;
  virtual int64_t steps_per_epoch() const = 0;  // the same in every epoch
  // Images per step over all ranks: train.batch_size, or what an image folder chose (open_train_data).
  virtual int64_t global_batch() const = 0;
  // Every image size a training batch can have (the model must accept each).
  virtual std::vector<data::BucketSize> image_sizes() const = 0;
  // Of the data itself (image bytes or the manifest): ranks compare it with the plan.
  virtual uint64_t data_hash() const = 0;
  virtual data::EpochPlan plan(int64_t epoch) const = 0;
  // This rank's part of global step `step`, counted from the start of training (epoch = step /
  // steps_per_epoch()). Consecutive steps are served from the prefetch queue.
  virtual StepBatch batch(int64_t step) = 0;
  // The run stops before this step: nothing after it is prefetched.
  virtual void set_end_step(int64_t /*end*/) {}
  // The images the trainer evaluates on (Fashion-MNIST's test split, a folder's held-out images,
  // one set per bucket); the data layer holds them, the trainer runs the model over them.
  virtual const std::vector<data::ImageSet>& evaluation_images() const = 0;
  // Files the manifest lists that cannot be decoded (never trained on, reported every epoch).
  virtual int64_t unreadable() const { return 0; }
  virtual std::string describe() const = 0;  // one line for the log
};

struct DataContext {
  std::string run_dir;
  bool resuming = false;
  int rank = 0;
  int world_size = 1;
  // train.batch_size was left at its default, so an image folder whose buckets cannot fill it may
  // train with a smaller global batch (global_batch() says which).
  bool batch_size_is_default = false;
  std::function<void(const std::string&)> on_info;  // progress of long work (scanning a folder)
};

// Opens what `settings` describes; data.dataset must be resolved (resolve_dataset). Throws before
// any training for missing data, an empty folder, a bucket table no image fits, or a global batch
// that no bucket can fill. A default train.batch_size (context.batch_size_is_default) that no bucket
// of an image folder can fill becomes what the fullest bucket holds, said through context.on_info
// on rank 0 (a small folder trains with the defaults); the caller records global_batch().
std::unique_ptr<TrainData> open_train_data(const RunSettings& settings, const DataContext& context);

// The two kinds (src/train/mnist_data.cpp, src/train/folder_data.cpp).
std::unique_ptr<TrainData> open_fashion_mnist(const RunSettings& settings, const DataContext& context);
std::unique_ptr<TrainData> open_image_folder(const RunSettings& settings, const DataContext& context);

}  // namespace lockstep::train
